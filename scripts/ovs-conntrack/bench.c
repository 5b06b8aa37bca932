/* Open vSwitch's userspace connection tracker (lib/conntrack.c), measured the way
 * ferry's conntrack benchmarks measure ferry's: a table of N UDP connections, then
 * packets of connections spread over the whole table (4096 of them, cycled), each
 * looked up and its connection updated, in batches of 32 as a PMD thread hands them
 * to conntrack_execute(). Built and run by scripts/bench-ovs-conntrack.sh against the
 * library of the Debian openvswitch-source package.
 *
 * Usage: bench established N PACKETS ROUNDS
 *        bench new N PACKETS ROUNDS
 * "established": as above. "new": new connections, each committed with source NAT to
 * 192.168.50.10, ports 1024-65535, in rounds of N in a table emptied between rounds (as
 * ferry's conntrack_new/snat_port_allocation_and_commit_4K_hot with N = 4096, and
 * conntrack_new/snat_port_allocation_and_commit, a table growing from empty, with
 * N = 2^20). Prints one line per round of measurement: nanoseconds per packet. */

#include <config.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "conntrack.h"
#include "csum.h"
#include "dp-packet.h"
#include "flow.h"
#include "netdev.h"
#include "packets.h"
#include "timeval.h"

/* Ethernet (02:00:00:00:00:01 to 02:00:00:00:00:02), IPv4 (20 bytes, DF, TTL 64), UDP
 * (8 bytes, checksum 0): the frame the addresses, ports and IPv4 checksum below are
 * written into. */
static const char frame[] = "020000000002" "020000000001" "0800"
                            "4500001c00004000401100000a000001ac100001"
                            "0400003500080000";

#define BATCH 32
#define SPREAD 4096

/* Connection i: the same tuple as ferry's benchmark gives it (benches/conntrack.rs,
 * conn()): 10.i.i.i -> 172.16.(i%1000/250).(i%250+1), UDP 1024+i%50000 -> 53. */
static struct dp_packet *
packet_for(uint32_t i, ovs_be16 *dl_type)
{
    struct dp_packet *pkt = dp_packet_new(sizeof frame / 2);
    struct flow flow;

    dp_packet_put_hex(pkt, frame, NULL);
    flow_extract(pkt, &flow);
    *dl_type = flow.dl_type;

    struct ip_header *ip = dp_packet_l3(pkt);
    struct udp_header *udp = dp_packet_l4(pkt);
    put_16aligned_be32(&ip->ip_src,
                       htonl((10u << 24) | (i & 0xffffff)));
    put_16aligned_be32(&ip->ip_dst,
                       htonl((172u << 24) | (16u << 16) | ((i % 1000 / 250) << 8)
                             | (i % 250 + 1)));
    udp->udp_src = htons(1024 + i % 50000);
    udp->udp_dst = htons(53);
    ip->ip_csum = 0;
    ip->ip_csum = csum(ip, sizeof *ip);
    return pkt;
}

/* As a packet newly received: no connection or state from an earlier pass. */
static void
fresh(struct dp_packet_batch *b)
{
    struct dp_packet *pkt;

    DP_PACKET_BATCH_FOR_EACH (j, pkt, b) {
        pkt_metadata_init_conn(&pkt->md);
        pkt->md.ct_state = 0;
    }
}

static void
execute(struct conntrack *ct, struct dp_packet_batch *b, ovs_be16 dl_type,
        const struct nat_action_info_t *nat)
{
    fresh(b);
    conntrack_execute(ct, b, dl_type, false, true, 0, NULL, NULL, 0, 0, NULL,
                      nat, time_msec(), 0);
}

static double
now_ns(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e9 + ts.tv_nsec;
}

/* New connections with source NAT: rounds of n, each in an emptied table. */
static int
new_connections(uint32_t n, unsigned long packets, int rounds)
{
    struct nat_action_info_t nat = {
        .min_addr.ipv4 = htonl(0xc0a8320a),
        .max_addr.ipv4 = htonl(0xc0a8320a),
        .min_port = 1024,
        .max_port = 65535,
        .nat_action = NAT_ACTION_SRC | NAT_ACTION_SRC_PORT,
    };
    ovs_be16 dl_type = 0;
    struct conntrack *ct = conntrack_init();
    uint32_t n_batches = (n + BATCH - 1) / BATCH;
    struct dp_packet_batch *batches = xcalloc(n_batches, sizeof *batches);

    conntrack_set_maxconns(ct, n + 1);
    for (int r = 0; r < rounds; r++) {
        double spent = 0;
        unsigned long done = 0;

        while (done < packets) {
            /* Not timed: the round's packets, and an empty table. */
            for (uint32_t i = 0; i < n; i++) {
                if (i % BATCH == 0) {
                    dp_packet_batch_init(&batches[i / BATCH]);
                }
                dp_packet_batch_add(&batches[i / BATCH], packet_for(i, &dl_type));
            }
            conntrack_flush(ct, NULL);

            double start = now_ns();
            for (uint32_t k = 0; k < n_batches; k++) {
                execute(ct, &batches[k], dl_type, &nat);
            }
            spent += now_ns() - start;
            done += n;

            uint32_t tracked = 0;
            conntrack_get_nconns(ct, &tracked);
            struct ip_header *ip = dp_packet_l3(batches[0].packets[0]);
            if (tracked != n
                || get_16aligned_be32(&ip->ip_src) != nat.min_addr.ipv4) {
                fprintf(stderr, "a round committed %u connections, not %u, or did not "
                        "translate\n", tracked, n);
                return 1;
            }
            for (uint32_t k = 0; k < n_batches; k++) {
                dp_packet_delete_batch(&batches[k], true);
            }
        }
        printf("%.1f\n", spent / done);
    }
    return 0;
}

int
main(int argc, char *argv[])
{
    if (argc != 5) {
        fprintf(stderr, "usage: %s established|new N PACKETS ROUNDS\n", argv[0]);
        return 2;
    }
    uint32_t n = strtoul(argv[2], NULL, 0);
    unsigned long packets = strtoul(argv[3], NULL, 0);
    int rounds = atoi(argv[4]);
    if (n == 0 || packets < SPREAD || rounds < 1) {
        fprintf(stderr, "N must be positive, PACKETS at least %d, ROUNDS at least 1\n",
                SPREAD);
        return 2;
    }
    if (!strcmp(argv[1], "new")) {
        return new_connections(n, packets, rounds);
    } else if (strcmp(argv[1], "established")) {
        fprintf(stderr, "%s: not established or new\n", argv[1]);
        return 2;
    }
    ovs_be16 dl_type = 0;
    struct conntrack *ct = conntrack_init();
    conntrack_set_maxconns(ct, n + 1);

    /* The table: every connection's first packet, committed, in batches. */
    for (uint32_t i = 0; i < n; i += BATCH) {
        struct dp_packet_batch b;

        dp_packet_batch_init(&b);
        for (uint32_t k = i; k < n && k < i + BATCH; k++) {
            dp_packet_batch_add(&b, packet_for(k, &dl_type));
        }
        execute(ct, &b, dl_type, NULL);
        dp_packet_delete_batch(&b, true);
    }
    uint32_t tracked = 0;
    conntrack_get_nconns(ct, &tracked);
    if (tracked != n) {
        fprintf(stderr, "expected %u connections, the table holds %u\n", n, tracked);
        return 1;
    }

    /* 4096 packets of connections spread over the whole table (ferry's spread()). */
    struct dp_packet_batch *batches = xcalloc(SPREAD / BATCH, sizeof *batches);
    for (uint32_t i = 0; i < SPREAD; i++) {
        struct dp_packet_batch *b = &batches[i / BATCH];

        if (i % BATCH == 0) {
            dp_packet_batch_init(b);
        }
        uint32_t c = (uint32_t) ((uint64_t) i * 2654435761u % n);
        dp_packet_batch_add(b, packet_for(c, &dl_type));
    }
    /* One pass first, so that every packet's connection is known (a new one would be
     * created here if not). */
    for (int k = 0; k < SPREAD / BATCH; k++) {
        execute(ct, &batches[k], dl_type, NULL);
    }
    conntrack_get_nconns(ct, &tracked);
    if (tracked != n) {
        fprintf(stderr, "the packets created connections: %u, not %u\n", tracked, n);
        return 1;
    }
    /* Every packet found its connection: tracked, valid. */
    for (int k = 0; k < SPREAD / BATCH; k++) {
        struct dp_packet *pkt;

        DP_PACKET_BATCH_FOR_EACH (j, pkt, &batches[k]) {
            uint8_t st = pkt->md.ct_state;

            if (!(st & CS_TRACKED) || (st & CS_INVALID) || !pkt->md.conn) {
                fprintf(stderr, "a packet was not tracked to its connection (state %#x)\n",
                        st);
                return 1;
            }
        }
    }

    for (int r = 0; r < rounds; r++) {
        double start = now_ns();
        for (unsigned long done = 0; done < packets; done += BATCH) {
            execute(ct, &batches[(done / BATCH) % (SPREAD / BATCH)], dl_type, NULL);
        }
        printf("%.1f\n", (now_ns() - start) / packets);
    }
    conntrack_get_nconns(ct, &tracked);
    if (tracked != n) {
        fprintf(stderr, "connections changed while measuring: %u, not %u\n", tracked, n);
        return 1;
    }
    return 0;
}
