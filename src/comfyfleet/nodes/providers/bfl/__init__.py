"""Black Forest Labs (FLUX): the API client, its fan-out driver, and the FLUX image node."""

from comfyfleet.nodes.providers.bfl.driver import BFLDriver
from comfyfleet.nodes.providers.bfl.nodes import BFLFluxImage

DRIVER = BFLDriver()
NODE_CLASS_MAPPINGS: dict[str, type] = {"BFLFluxImage": BFLFluxImage}
NODE_DISPLAY_NAME_MAPPINGS: dict[str, str | None] = {"BFLFluxImage": "FLUX Image (BFL API)"}
