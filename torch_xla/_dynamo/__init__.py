"""torch.compile's openxla backends on our core (see dynamo_bridge)."""
