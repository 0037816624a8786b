"""Entry point of yeto-torch (group ``yeto``, name ``torch``).

Registers nothing yet: its implementations land with their own tests, and
``yeto plugins`` never claims a capability that does not work.
"""
