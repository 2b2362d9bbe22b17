"""Sample captures that follow the capture contract: synthetic (with damage injection) and real games."""
