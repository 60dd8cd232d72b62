"""`swarm-api`: an OpenAI-compatible HTTP gateway and chat page in front of the swarm (docs/api.md).

A client application: one shared `DistributedModel`, each request its own inference session.

Files and what each one owns:
  cli.py        the `swarm-api` typer command: join the swarm, serve HTTP, stop cleanly
  app.py        aiohttp routes: /v1/chat/completions, /v1/completions, /v1/models, /health, /metrics, /
  schema.py     request bodies -> frozen dataclasses, strict validation (400 naming the parameter)
  engine.py     runs `generate` on worker threads, tokens -> asyncio queue, cancel on disconnect
  text.py       incremental detokenization (multi-byte safe) and stop-string hold-back
  responses.py  OpenAI response objects and stream chunks
  streaming.py  server-sent events (`data: ...`, `data: [DONE]`)
  errors.py     `ApiError` in OpenAI's JSON shape; swarm failures -> 400/429/503
  metrics.py    Prometheus metrics under vLLM's names (`layerswarm:time_to_first_token_seconds`, ...)
  page.py       the chat page (inline CSS and script, no external assets)
  process.py    `GatewayProcess`: swarm-api as a child process (make chat, benchmarks, tests)
  demo.py       `make chat`: a local SmolLM2 swarm with the gateway in front
"""
