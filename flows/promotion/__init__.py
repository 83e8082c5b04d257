"""Promotion: the gate's rules and champion records, and the operator's promote/rollback."""
