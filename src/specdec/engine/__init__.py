"""The one decode loop and what it rests on: verification (`verify`) and the acceptance rules it calls
(`accept`, with SpecTr's selection in `spectr` and random numbers by output position in `uniforms`),
the rows' node budget (`planner`), the measured pass costs (`costs`) and the generation settings and
results (`generation`).

It drives backends only through `specdec.backends.contract` and proposers only through
`specdec.engine.generation.Proposer`; it never imports a proposer module or an application.
"""
