"""The sealsync relay: stores and serves sealed envelopes between one person's devices.

It never holds a key and never decrypts; its code imports only `replica.wire` and
`replica.errors` from the engine.
"""
