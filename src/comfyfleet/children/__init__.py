"""Child prompts: the part of a prompt upstream of one input, run on the fleet as prompts
of their own (the "Run on the Fleet" node), each a real job with its parent named."""
