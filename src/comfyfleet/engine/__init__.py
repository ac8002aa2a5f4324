"""The built-in engine: node registry, validation, execution, output cache."""
