"""A job's record: its states and their one transition, its runs, the spend ledger, what it left.

May import the ground (bot/engine/*.py but service.py).
"""
