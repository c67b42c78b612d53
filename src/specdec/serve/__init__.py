"""The OpenAI-compatible HTTP server: `specdec serve`.

Modules: `schema` (request models), `metrics` (Prometheus), `scheduler` (the
decode queue), `replies` (response and error shapes), `app` (routes and
`serve`), `process` (run a server as a child process, for tests and benchmarks).
Nothing is imported here, so `import specdec.serve.process` stays light.
"""
