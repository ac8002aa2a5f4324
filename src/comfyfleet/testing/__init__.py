"""Test support that ships with comfyfleet: local stand-ins for paid APIs."""
