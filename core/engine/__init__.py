"""engine: cycles that agree on and run collectives: codec, negotiation, fusion, compression, collectives."""
