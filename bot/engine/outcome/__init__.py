"""A run's end and what it leaves: finish, the Hub push, the billed card, calibration, charts.

May import launching/, money/, record/ and the ground (bot/engine/*.py but service.py).
"""
