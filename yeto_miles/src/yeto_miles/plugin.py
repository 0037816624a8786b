"""Entry point of yeto-miles (group ``yeto``, name ``miles``).

Registers nothing yet: its implementations land with their own tests, and
``yeto plugins`` never claims a capability that does not work.
"""
