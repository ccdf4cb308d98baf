"""(see package docstring)"""
