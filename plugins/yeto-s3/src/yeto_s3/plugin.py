"""Entry point of yeto-s3 (group ``yeto``, name ``s3``).

Registers nothing yet: its implementations land with their own tests, and
``yeto plugins`` never claims a capability that does not work.
"""
