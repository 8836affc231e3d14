"""The proxy's HTTP front: the app, its routers (a folder per dialect: routes.py beside schemas.py), the service they
call (BLS calls on the exports' models) and the server it runs in. model.py (beside this package) is the Triton glue
and lists the modules; the models' library is the package model_library, installed beside model.py by export."""
