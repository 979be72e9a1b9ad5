"""Adapters: drive a system under test through the operation vocabulary and map its
concrete state onto the spec's AbstractState. The only package that knows both."""
