"""kvcheck's tensor implementation of SGLang's streaming-session KV bookkeeping.

Structured like upstream (ReqToTokenPool, TokenToKVPoolAllocator,
PagedTokenToKVPoolAllocator, RadixCache, StreamingSession, SessionController and the
scheduler glue of mem_cache/common.py), with upstream names. It never imports spec/:
the implementation must not lean on the model it is checked against.
"""
