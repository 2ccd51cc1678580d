# The kind node's base, offline: kind's own node files (entrypoint, systemd units,
# containerd config; copied into the build context from the kind module by build.sh) on a
# debootstrapped Debian, Debian's systemd, runc and CNI plugins, and containerd 2 built
# from its Go module (CDI). kind's upstream base builds the same parts from git clones.
ARG DEBIAN
FROM ${DEBIAN}
COPY files/usr/local/bin/ /usr/local/bin/
COPY files/kind/ /kind/
COPY files/etc/ /etc/
COPY containerd/ /usr/local/bin/
COPY ctr-offline /usr/local/bin/ctr-offline
RUN chmod 755 /usr/local/bin/* /kind /kind/bin /kind/bin/* \
 && apt-get update -q \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends \
      systemd conntrack iptables nftables iproute2 ethtool util-linux mount kmod \
      libseccomp2 pigz e2fsprogs bash ca-certificates curl jq procps \
      runc containernetworking-plugins \
 && apt-get clean && rm -rf /var/lib/apt/lists/* \
 && find /lib/systemd/system/sysinit.target.wants/ -name systemd-tmpfiles-setup.service -delete \
 && rm -f /lib/systemd/system/multi-user.target.wants/* /etc/systemd/system/*.wants/* \
          /lib/systemd/system/local-fs.target.wants/* /lib/systemd/system/sockets.target.wants/*udev* \
          /lib/systemd/system/sockets.target.wants/*initctl* /lib/systemd/system/basic.target.wants/* \
 && echo "ReadKMsg=no" >> /etc/systemd/journald.conf \
 && ln -sf /usr/lib/systemd/systemd /sbin/init \
 && mkdir -p /opt/cni /etc/kubernetes/manifests && ln -sfn /usr/lib/cni /opt/cni/bin
# The node runs in a container of a VM that may not let it lower OOM scores or raise
# limits past the host's (RLIMIT_NOFILE's hard limit is 20000 on these machines): such
# settings fail containerd's start, so they go; restrict_oom_score_adj keeps pods' scores
# within what the node may set.
RUN sed -i -e '/^OOMScoreAdjust=/d' -e '/^LimitNPROC=/d' -e 's/^LimitNOFILE=.*/LimitNOFILE=20000/' \
      /etc/systemd/system/containerd.service \
 && sed -i 's/restrict_oom_score_adj = false/restrict_oom_score_adj = true/' /etc/containerd/config.toml \
 && systemctl enable kubelet.service containerd.service undo-mount-hacks.service \
 && systemctl mask systemd-binfmt.service \
 && ctr oci spec | jq '.hooks.createContainer[.hooks.createContainer | length] |= . + {"path": "/kind/bin/mount-product-files.sh"}' \
      | jq 'del(.process.rlimits)' > /etc/containerd/cri-base.json \
 && containerd --version && runc --version \
 && mv /usr/local/bin/ctr /usr/local/bin/ctr.real && mv /usr/local/bin/ctr-offline /usr/local/bin/ctr
ENV container=docker
STOPSIGNAL SIGRTMIN+3
ENTRYPOINT ["/usr/local/bin/entrypoint", "/sbin/init"]
