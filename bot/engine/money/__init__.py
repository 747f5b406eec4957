"""Money as people read it: budgets, volumes, summaries, reports, the dashboard, a slow job's warning.

May import record/ and the ground (bot/engine/*.py but service.py).
"""
