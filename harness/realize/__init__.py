"""The builder: realizes locked objects (interpreters, wheels, sources, weights, environments)."""
