"""The proxy's HTTP front: the app, its routers (one per dialect), the service they call (BLS calls on the exports'
models) and the server it runs in. model.py (beside this package) is the Triton glue; the models' library
(model_errors, model_outputs, request_rules, tracing, triton_server) is installed beside model.py by export and
imported top-level."""
