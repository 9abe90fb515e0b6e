"""Launch choices per GPU family.
"""
