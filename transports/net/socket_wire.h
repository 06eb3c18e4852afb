/* The Socket provider's wire format (transports/net/socket.c), in one place so
 * that the tests can forge every message a peer may send. Every integer is
 * little-endian on the wire, whatever the host.
 *
 * A connection is 1 control socket plus nsocks data sockets (nsocks =
 * nthreads * nsocks_per_thread, 0..64), all made by the sender to the
 * receiver's listen address. The sender writes, the receiver reads: no
 * socket carries anything the other way.
 *
 *   listen handle (opaque to the caller, PLAIT_NET_HANDLE_BYTES):
 *     0  u32 magic "PLSH"      4 u8 version   5 u8 family (4 or 6)
 *     6  u8 nthreads           7 u8 nsocks
 *     8  u16 port (network order)  10 u16 0
 *    12  u32 IPv6 scope id    16 u8[16] address (IPv4: first 4 bytes)
 *    32  u8[32] token (random, drawn by listen)
 *    64  u64 connect id: the connector's progress (0 in a fresh handle)
 *
 *   hello, first bytes on every socket (HELLO_BYTES):
 *     0  u32 magic "PLSC"      4 u8 version   5 u8 index (0 = control, 1..nsocks data)
 *     6  u8 nsocks             7 u8 0
 *     8  u64 connection id (random per connection: groups its sockets)
 *    16  u8[32] token (from the handle)
 *
 *   message header, on the control socket, one per isend (MSG_BYTES):
 *     0  u32 magic "PLSM"      4 u32 seq (0, 1, 2, ... per comm)
 *     8  u64 size             16 i32 tag      20 u32 flags
 *   flags: MSG_INLINE = the size bytes follow on the control socket (always
 *   for size <= INLINE_MAX or nsocks == 0); without it they go in pieces on
 *   the data sockets as split_message() says, both ends computing the same
 *   split from the size and the running socket counter.
 *
 *   piece header, on a data socket, before each piece (PIECE_BYTES):
 *     0  u32 magic "PLSP"      4 u32 seq of the message
 *     8  u64 offset in the message   16 u64 length
 */
#ifndef PLAIT_NET_SOCKET_WIRE_H
#define PLAIT_NET_SOCKET_WIRE_H

#include <stddef.h>
#include <stdint.h>

#define SOCK_WIRE_VERSION 1
#define SOCK_HANDLE_MAGIC 0x48534c50u /* "PLSH" */
#define SOCK_HELLO_MAGIC 0x43534c50u  /* "PLSC" */
#define SOCK_MSG_MAGIC 0x4d534c50u    /* "PLSM" */
#define SOCK_PIECE_MAGIC 0x50534c50u  /* "PLSP" */

#define SOCK_TOKEN_BYTES 32
#define SOCK_HANDLE_USED 72
#define SOCK_HELLO_BYTES 48
#define SOCK_MSG_BYTES 24
#define SOCK_PIECE_BYTES 24

#define SOCK_MSG_INLINE 0x1u

/* Most data sockets per connection and helper threads (NCCL's limits). */
#define SOCK_MAX_SOCKETS 64
#define SOCK_MAX_THREADS 16
/* A message of at most this many bytes goes whole on the control socket, in
 * one write of header and data, read by the caller's thread. */
#define SOCK_INLINE_MAX (64 * 1024)
/* A large message is cut into pieces of at least this (one per data socket
 * at most), 4 KiB-aligned. */
#define SOCK_MIN_PIECE (64 * 1024)

static inline void sock_put_u16(uint8_t *p, uint16_t v)
{
    p[0] = (uint8_t)v;
    p[1] = (uint8_t)(v >> 8);
}
static inline void sock_put_u32(uint8_t *p, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}
static inline void sock_put_u64(uint8_t *p, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}
static inline uint16_t sock_get_u16(const uint8_t *p)
{
    return (uint16_t)(p[0] | (p[1] << 8));
}
static inline uint32_t sock_get_u32(const uint8_t *p)
{
    uint32_t v = 0;
    for (int i = 3; i >= 0; i--)
        v = (v << 8) | p[i];
    return v;
}
static inline uint64_t sock_get_u64(const uint8_t *p)
{
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--)
        v = (v << 8) | p[i];
    return v;
}

static inline void sock_msg_encode(uint8_t out[SOCK_MSG_BYTES], uint32_t seq, uint64_t size, int32_t tag,
                                   uint32_t flags)
{
    sock_put_u32(out, SOCK_MSG_MAGIC);
    sock_put_u32(out + 4, seq);
    sock_put_u64(out + 8, size);
    sock_put_u32(out + 16, (uint32_t)tag);
    sock_put_u32(out + 20, flags);
}

static inline void sock_piece_encode(uint8_t out[SOCK_PIECE_BYTES], uint32_t seq, uint64_t offset, uint64_t len)
{
    sock_put_u32(out, SOCK_PIECE_MAGIC);
    sock_put_u32(out + 4, seq);
    sock_put_u64(out + 8, offset);
    sock_put_u64(out + 16, len);
}

static inline void sock_hello_encode(uint8_t out[SOCK_HELLO_BYTES], int index, int nsocks, uint64_t conn_id,
                                     const uint8_t token[SOCK_TOKEN_BYTES])
{
    sock_put_u32(out, SOCK_HELLO_MAGIC);
    out[4] = SOCK_WIRE_VERSION;
    out[5] = (uint8_t)index;
    out[6] = (uint8_t)nsocks;
    out[7] = 0;
    sock_put_u64(out + 8, conn_id);
    for (int i = 0; i < SOCK_TOKEN_BYTES; i++)
        out[16 + i] = token[i];
}

/* Whether a message of `size` bytes goes inline on the control socket. */
static inline int sock_msg_is_inline(uint64_t size, int nsocks)
{
    return nsocks == 0 || size <= SOCK_INLINE_MAX;
}

/* The split of a non-inline message: *npieces_out pieces of *piece_out bytes
 * (the last one shorter), on data sockets first, first+1, ... mod nsocks. */
static inline void sock_split_message(uint64_t size, int nsocks, int *npieces_out, uint64_t *piece_out)
{
    uint64_t n = (size + SOCK_MIN_PIECE - 1) / SOCK_MIN_PIECE;
    if (n > (uint64_t)nsocks)
        n = (uint64_t)nsocks;
    if (n == 0)
        n = 1;
    uint64_t piece = (size + n - 1) / n;
    piece = (piece + 4095) / 4096 * 4096;
    *piece_out = piece;
    *npieces_out = (int)((size + piece - 1) / piece);
}

#endif
