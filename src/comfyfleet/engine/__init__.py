"""The built-in engine: node registry, validation, execution, output cache.

Import from the modules: `engine.executor.Engine`, `engine.run.ExecutionRequest`,
`engine.registry.build_registry`, `engine.context.ProgressBar`, ...
"""
