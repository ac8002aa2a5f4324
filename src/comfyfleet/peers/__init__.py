"""Files any gateway can serve: the gateways sharing one store ask each other for the
input, output and temp files one of them holds and another is asked for.

Each gateway records in the store the URL its peers reach it at (`peer_url`). A file
missing locally is asked of the live peers over an internal route, signed with a key
the gateways share through the store (`signing`), and kept locally once fetched
(`keep`). A job another gateway runs is cancelled by asking that gateway (`cancel`).
With one gateway there is no peer to ask: nothing changes.
"""

from comfyfleet.peers.fetch import FileRef, PeerFiles
from comfyfleet.peers.signing import PEER_FILE_ROUTE, PEER_ROUTES, PeerKey

__all__ = ["PEER_FILE_ROUTE", "PEER_ROUTES", "FileRef", "PeerFiles", "PeerKey"]
