"""The cluster component: a validating admission webhook for claims and claim templates.

`validate.py` and `admission.py` are pure (claim checks; AdmissionReview in and out),
`tls.py` makes or loads the serving certificate, `cabundle.py` keeps the webhook
configuration trusting it, `server.py` is the HTTP shell and `main.py` the wiring.
"""
