"""Entry point of yeto-modal (group ``yeto``, name ``modal``).

Registers nothing yet: its implementations land with their own tests, and
``yeto plugins`` never claims a capability that does not work.
"""
