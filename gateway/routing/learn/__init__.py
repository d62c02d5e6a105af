"""The routing learning loop: fit, evaluate, judge and calibrate a policy's classifier offline.

Run by ``switchyard route ...``; the request path (:mod:`gateway.routing`) never imports it.
"""
