"""Conversion: node slots that change between sampler and trainer roles."""
