"""Files: `/view` and uploads, and files for other gateways."""
