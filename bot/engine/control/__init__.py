"""A job's life as people drive it: create, approve, launch, stop, resume, sweeps, compare.

May import outcome/, launching/, money/, record/ and the ground (bot/engine/*.py but service.py).
"""
