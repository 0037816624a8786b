"""Entry point of yeto-nc (group ``yeto``, name ``nc``).

Registers nothing yet: its implementations land with their own tests, and
``yeto plugins`` never claims a capability that does not work.
"""
