"""The built-in engine: node registry, validation, execution, output cache.

Import from the modules: `engine.executor.Engine`, `engine.run.ExecutionRequest`,
`engine.registry.NodeRegistry`, `engine.context.ProgressBar`, ... The registry a
process runs with is composed above the engine: `comfyfleet.nodes.build_registry`.
"""
