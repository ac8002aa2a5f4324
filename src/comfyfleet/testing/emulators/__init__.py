"""Local stand-ins for the paid provider APIs: one module per API, one app serving them all."""

from comfyfleet.testing.emulators.app import build_emulator_app, emulator_state
from comfyfleet.testing.emulators.state import EmulatorSettings, EmulatorState

__all__ = ["EmulatorSettings", "EmulatorState", "build_emulator_app", "emulator_state"]
