"""A collective's send schedule as plain data: :class:`Step` and :func:`message_counts`, defined in
:mod:`dpcomm.messages` (torch-free, so the network simulator can use it without importing the collectives)."""

from dpcomm.messages import Step, message_counts

__all__ = ["Step", "message_counts"]
