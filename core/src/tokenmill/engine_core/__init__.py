"""The engine core: what runs in the engine process (or in-process under ``LLMEngine``).

``resolve_config`` turns EngineArgs into a frozen EngineConfig, ``build_engine_core`` loads the model
and allocates the cache, ``EngineCore.step`` schedules, executes and updates, and ``core_process`` runs
it behind the ZMQ sockets. It has no tokenizer and never imports the front end: requests come in and
outputs go out as ``tokenmill.wire`` messages.
"""
