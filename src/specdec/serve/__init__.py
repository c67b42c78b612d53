"""The OpenAI-compatible HTTP server: `specdec serve`.

Modules: `config` (what a server is told), `keys` (where API keys come from),
`schema` (request models), `options` (what a request may set of a method),
`pool` (the proposers kept), `metrics` (Prometheus), `fair` (the per-key waiting
room), `scheduler` (the decode queue), `prefill` (the prefill chunk), `replies`
(response and error shapes), `guard` and `http` (what every request passes
before a route), `exactness` (exact verification by default), `shutdown` (the
drain on SIGTERM), `app` (routes and `serve`), `process` (run a server as a
child process, for tests and benchmarks). Nothing is imported here,
so `import specdec.serve.process` stays light.
"""
