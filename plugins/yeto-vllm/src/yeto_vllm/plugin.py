"""Entry point of yeto-vllm (group ``yeto``, name ``vllm``).

Registers nothing yet: its implementations land with their own tests, and
``yeto plugins`` never claims a capability that does not work.
"""
