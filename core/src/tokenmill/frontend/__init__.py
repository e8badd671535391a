"""The front end: what runs in the caller's process (``LLM``) or the API server's process.

``LLMEngine`` (synchronous, with an in-process EngineCore) and ``AsyncLLM`` (asyncio, with the
EngineCore in its own process behind ``EngineCoreClient``) share the InputProcessor (prompts ->
validated token ids), the OutputProcessor (the one registry of unfinished requests; engine outputs ->
RequestOutputs) and ``parallel_sampling`` (n > 1 / best_of). It talks to the engine core only in the
messages of ``tokenmill.wire``.
"""
