"""The ``dpcomm`` command line: a thin shell over library functions, one module per sub-command."""
