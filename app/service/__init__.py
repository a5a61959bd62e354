"""Serving an index to many clients, below every transport: the one scheduler of model work, an
index served through it, the table of operations each transport dispatches through and the request
types they share."""
