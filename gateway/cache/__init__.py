"""The response cache: a repeated request answered from Redis instead of the upstream.

``policy.py`` the policy's ``cache:`` section; ``key.py`` which requests may be cached and
their key (canonical JSON, the deployment's model, the tenant's namespace); ``entry.py``
an entry's bytes; ``replay.py`` a stored answer in the form the request asked for;
``service.py`` the lookups and stores on the request path (bounded, failing open);
``cli.py`` ``switchyard cache``.
"""
