"""GeoPT: lifted geometric pre-training (random-walk dynamics on geometry) for neural simulators."""
