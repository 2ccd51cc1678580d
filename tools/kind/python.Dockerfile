# The image's Python where no registry serves python:*-slim: Debian's python3 on the
# debootstrapped Debian. venv (and its pip) builds the install the image copies.
ARG DEBIAN
FROM ${DEBIAN}
RUN apt-get update -q \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends python3 python3-venv ca-certificates \
 && apt-get clean && rm -rf /var/lib/apt/lists/* /usr/share/doc/* /usr/share/man/*
