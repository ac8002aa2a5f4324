"""Workers: machines that join the fleet by connecting out to a gateway (behind NAT or
a firewall), each bringing a backend that the gateway reaches through that connection
(comfyfleet.tunnel) and dispatches to as one of its own lanes. This package is the
worker's side (`comfyfleet worker`) and the worker tokens; the gateway's is
comfyfleet.server.workers."""
