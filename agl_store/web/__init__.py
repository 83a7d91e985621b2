"""The web toolkit the store server, the proxy and the view share.

Starlette/uvicorn plumbing that is not about the store itself: running an app under uvicorn
(`serving`), the aiohttp transport both HTTP clients use (`http_transport`), bearer-key auth
(`auth`), the cross-site guard (`cross_site`), and endpoint wrapping and JSON error bodies
(`wire`). It lives in `agl_store` because the store is the package every other one depends on;
`agl_proxy` and `agl_train.view` import it from here.
"""
