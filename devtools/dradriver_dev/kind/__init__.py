"""dradriver in a real kind cluster: the image built, the chart installed, fake GPUs
handed to real containers by real containerd (`make kind-demo`, `make kind-test`).

- images.py: the Docker engine, which images (stock or built offline), the driver image;
- cluster.py: the kind cluster (config, create, the offline network, down) and kubectl;
- demo.py: the chart installed, every example claim applied, what each container got.
"""
