#!/usr/bin/env python3
"""Misbehaving peers for the tcp channel's cli cases (tests/cli_test.sh, stage 4).

  fake_peer.py silent              listens on 127.0.0.1:0, prints the port, accepts every
                                   connection and never sends a byte (a hung worker)
  fake_peer.py relay PORT FRAMES   listens on 127.0.0.1:0, prints the port, forwards one
                                   connection to the worker at PORT until the worker has sent
                                   FRAMES frames, then stops reading either side and keeps both
                                   open (a worker that goes silent: 1, right after its HelloOk)
  fake_peer.py garbage PORT        connects to the worker at PORT five times with input it
                                   must refuse, one connection each, then exits 0
"""
import os
import select
import socket
import struct
import sys
import time

MAGIC = 0x314B4454  # 'T','D','K','1' little-endian, as backend/transfer/wire.h
HELLO = 1


def listen(rcvbuf=0):
    s = socket.socket()
    if rcvbuf:  # set before listen(): accepted sockets inherit it and advertise that window
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    s.bind(("127.0.0.1", 0))
    s.listen(8)
    print(s.getsockname()[1], flush=True)
    return s


def silent():
    s = listen()
    held = []
    while True:
        c, _ = s.accept()
        held.append(c)


def relay(port, frames):
    s = listen(rcvbuf=4096)  # a small window: once the relay stops reading, the sender's writes stop too
    a, _ = s.accept()
    b = socket.create_connection(("127.0.0.1", port))
    # Forward the worker's frames whole (a 24-byte header, the payload's length at offset 8),
    # FRAMES of them; then read nothing more from either side.
    buf, left = b"", frames
    while left > 0:
        ready, _, _ = select.select([a, b], [], [])
        if a in ready:
            data = a.recv(1 << 16)
            if not data:
                return
            b.sendall(data)
        if b in ready:
            data = b.recv(1 << 16)
            if not data:
                return
            buf += data
            while left > 0 and len(buf) >= 24:
                size = 24 + struct.unpack_from("<Q", buf, 8)[0]
                if len(buf) < size:
                    break
                a.sendall(buf[:size])
                buf, left = buf[size:], left - 1
    time.sleep(3600)


def send_and_close(port, data, half_close=True):
    c = socket.create_connection(("127.0.0.1", port), timeout=10)
    try:  # a worker may close first (a secret's Challenge, then the first bad byte): that is fine
        c.sendall(data)
        if half_close:
            c.shutdown(socket.SHUT_WR)
            while c.recv(4096):  # whatever the worker answers (an Error frame), until it closes
                pass
    except (ConnectionError, OSError):
        pass
    c.close()


def header(msg_type, length, checksum):
    return struct.pack("<IHHQQ", MAGIC, msg_type, 0, length, checksum)


def garbage(port):
    send_and_close(port, os.urandom(4096))  # no magic
    payload = struct.pack("<IQ", 1, 5) + b"model"  # a Hello's shape, with a wrong checksum
    send_and_close(port, header(HELLO, len(payload), 0x0123456789ABCDEF) + payload)
    send_and_close(port, header(HELLO, 1 << 40, 0))  # a payload far over the limit
    send_and_close(port, header(77, 0, 0))  # an unknown message type
    send_and_close(port, b"TDK1\x01", half_close=False)  # a header cut short


if __name__ == "__main__":
    mode = sys.argv[1]
    if mode == "silent":
        silent()
    elif mode == "relay":
        relay(int(sys.argv[2]), float(sys.argv[3]))
    elif mode == "garbage":
        garbage(int(sys.argv[2]))
    else:
        sys.exit(f"unknown mode {mode}")
