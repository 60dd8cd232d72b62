"""Any libp2p speaks our protocol: a py-libp2p client generates SmolLM2 through two real peers.

The client (tests/interop/libp2p_client.py) runs in its own virtual environment (.venv-interop,
tests/interop/venv.py) and its own process: py-libp2p and hivemind cannot share a process (both
register the protobuf package `crypto.pb`). It imports nothing of ours; it follows docs/protocol.md.
Also here: the `view` request (peer/view.py), through a real peer and on plain data, and the
client's own check of the records' signatures (tests/interop/signed_records.py) against values
signed by hivemind, tampered ones included.
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import msgpack
import pytest
import torch
from cryptography.hazmat.primitives.asymmetric import rsa
from hivemind.dht.validation import DHTRecord
from hivemind.utils import MSGPackSerializer, get_dht_time

from client.local_swarm import LocalSwarm
from peer.view import MAX_VIEW_BYTES, ViewService, bounded_reply
from swarm import messages as m
from swarm.codec import Limits
from swarm.connection import open_stream
from swarm.dht import model_key
from swarm.errors import RemoteError
from swarm.identity import IdentityKey, peer_id_of
from swarm.records import RecordSigner, SignedRecord, dht_key_bytes, open_signed, owner_of
from swarm.schema import MAX_VIEW_RECORDS, View, ViewReply, parse_reply
from swarm.types import LayerRange, PeerRecord, PeerState, SwarmView
from tests.interop.venv import InteropUnavailable, interop_python
from tests.swarm_processes import new_test_swarm

CLIENT = Path(__file__).parent / "interop" / "libp2p_client.py"
VERIFIER = Path(__file__).parent / "interop" / "signed_records.py"
DECODE_STEPS = 16
PROMPT = "The three primary colors are"
CLIENT_TIMEOUT = 240.0  # seconds for one client run (a loaded 2-core machine decodes at ~2 tokens/s)


@dataclass
class SmolSwarm:
    model: Path
    swarm: LocalSwarm
    entry: str  # multiaddr of the first peer: the only address the interop client is given
    first: str  # peer ids
    second: str


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def smol_swarm(demo_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[SmolSwarm]:
    """A DHT and two `swarm-peer serve` of SmolLM2 (layers 0:15 and 15:30), started side by side."""
    swarm = new_test_swarm(tmp_path_factory.mktemp("interop-swarm"))
    try:
        swarm.start_dht()
        port = free_port()  # a known TCP port: the client dials /ip4/127.0.0.1/tcp/PORT/p2p/ID
        first = swarm.start_peer(demo_model, "0:15", "--host-maddrs", f"/ip4/127.0.0.1/tcp/{port}", wait=False)
        second = swarm.start_peer(demo_model, "15:30", wait=False)
        swarm.wait_online(first)
        swarm.wait_online(second)
        entry = f"/ip4/127.0.0.1/tcp/{port}/p2p/{first.peer_id}"
        yield SmolSwarm(demo_model, swarm, entry, first.peer_id, second.peer_id)
    finally:
        swarm.close()


@pytest.fixture(scope="module")
def interop_venv() -> Path:
    try:
        return interop_python()
    except InteropUnavailable as e:
        pytest.skip(f"py-libp2p (tests/interop/requirements.txt) could not be installed: {e}")


@pytest.fixture(scope="module")
def prompt_and_reference(smol_swarm: SmolSwarm) -> tuple[list[int], list[int]]:
    """The prompt's token ids and transformers' greedy continuation: prefill + DECODE_STEPS tokens."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    ids = AutoTokenizer.from_pretrained(smol_swarm.model)(PROMPT)["input_ids"]
    model = AutoModelForCausalLM.from_pretrained(smol_swarm.model, dtype=torch.float32).eval()
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # beside three busy processes, more threads make it 20x slower (spinning)
    try:  # min_new_tokens: no EOS stop, the client takes exactly DECODE_STEPS steps too
        out = model.generate(torch.tensor([ids]), max_new_tokens=DECODE_STEPS + 1,
                             min_new_tokens=DECODE_STEPS + 1, do_sample=False)
    finally:
        torch.set_num_threads(threads)
    return ids, out[0, len(ids):].tolist()


def run_client(python: Path, swarm: SmolSwarm, prompt: list[int], *extra: str) -> dict:
    command = [str(python), str(CLIENT), "--peer", swarm.entry, "--model-dir", str(swarm.model),
               "--prompt-ids", ",".join(map(str, prompt)), *extra]
    env = dict(os.environ, OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1")  # its LM head shares 2 cores
    done = subprocess.run(command, capture_output=True, text=True, timeout=CLIENT_TIMEOUT, env=env)
    assert done.returncode == 0, f"interop client failed ({done.returncode}):\n{done.stderr[-4000:]}"
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.slow
@pytest.mark.demo_model
@pytest.mark.timeout(1200)  # its setup may build .venv-interop (~1-3 min) and start the swarm (~2 min, loaded CI)
def test_py_libp2p_client_generates_like_transformers(interop_venv: Path, smol_swarm: SmolSwarm,
                                                      prompt_and_reference) -> None:
    prompt, reference = prompt_and_reference
    out = run_client(interop_venv, smol_swarm, prompt, "--decode-steps", str(DECODE_STEPS))
    assert (out["security"], out["muxer"]) == ("noise", "yamux")
    assert out["info"]["peer_id"] == smol_swarm.first and out["info"]["layers"] == [0, 15]
    # Both records came signed, and the client's own check (not the peer's word) accepted them.
    seen = {r["peer_id"]: r["layers"] for r in out["view"]["records"]}
    assert seen == {smol_swarm.first: [0, 15], smol_swarm.second: [15, 30]}
    assert out["view"]["rejected"] == []
    assert out["view"]["num_layers"] == 30 and out["view"]["truncated"] is False
    # The second peer's address came from the view alone; the client relayed 0:15 -> 15:30 itself.
    assert out["route"] == [[smol_swarm.first, 0, 15], [smol_swarm.second, 15, 30]]
    assert out["tokens"] == reference  # prefill + 16 greedy decode steps, token for token
    print(f"py-libp2p client: prefill {out['prefill_seconds']:.2f} s, decode {out['decode_ms_per_token']:.0f} ms/token")


@pytest.mark.slow
@pytest.mark.demo_model
def test_py_libp2p_client_over_tls_and_mplex(interop_venv: Path, smol_swarm: SmolSwarm, prompt_and_reference) -> None:
    """Our peers' p2pd also accepts TLS 1.3 and mplex: the other security and muxer py-libp2p offers."""
    prompt, reference = prompt_and_reference
    out = run_client(interop_venv, smol_swarm, prompt, "--decode-steps", "2", "--security", "tls", "--muxer", "mplex")
    assert (out["security"], out["muxer"]) == ("tls", "mplex")
    assert out["tokens"] == reference[:3]


@pytest.mark.slow
@pytest.mark.demo_model
async def test_view_answers_the_records_a_peer_sees(smol_swarm: SmolSwarm, swarm_node_factory) -> None:
    node = swarm_node_factory(initial_peers=smol_swarm.swarm.initial_peers, client_mode=True)
    p2p = await node.replicate_p2p()
    stream = await open_stream(p2p, smol_swarm.first, Limits())
    try:
        deadline = time.monotonic() + 30
        while True:  # the second peer's first announcement may still be on its way through the DHT
            reply = await stream.request({"type": m.VIEW}, timeout=20)  # no model: the peer's own
            if len(reply["records"]) == 2 or time.monotonic() > deadline:
                break
            await asyncio.sleep(1)
        parsed = parse_reply(reply, Limits(), ViewReply)  # the typed schema accepts it
        key = model_key(smol_swarm.model.name)
        opened = [open_signed(key, signed, node.signer) for signed in parsed.records]
        assert all(o is not None for o in opened), "a relayed record's signature does not verify"
        records = {r.peer_id: r for r in (PeerRecord.from_dict(value) for _subkey, value in opened)}
        assert {subkey.split("[owner:")[0] for subkey, _ in opened} == set(records)  # each signed by its own key
        assert reply["model"] == smol_swarm.model.name and reply["num_layers"] == 30
        assert {pid: str(r.layers) for pid, r in records.items()} == {smol_swarm.first: "0:15",
                                                                      smol_swarm.second: "15:30"}
        assert all(r.state is PeerState.ONLINE and r.addrs for r in records.values())
        assert reply["truncated"] is False

        unknown = await stream.request({"type": m.VIEW, "model": "no-such-model"}, timeout=20)
        assert (unknown["records"], unknown["num_layers"], unknown["truncated"]) == ([], 0, False)
        with pytest.raises(RemoteError) as refused:
            await stream.request({"type": m.VIEW, "model": 7}, timeout=20)
        assert refused.value.code == "bad_field"
        info = await stream.request({"type": m.INFO}, timeout=20)  # the stream still serves
        assert info["record"]["peer_id"] == smol_swarm.first
    finally:
        await stream.close()
        await p2p.shutdown()


def synthetic_view(count: int) -> tuple[SwarmView, dict[str, SignedRecord]]:
    """A view of `count` records and, standing in for their signed values, 600 bytes naming each."""
    records, signed = {}, {}
    for i in range(count):
        state = PeerState.OFFLINE if i % 3 == 0 else PeerState.ONLINE
        records[f"peer{i:04d}"] = PeerRecord(peer_id=f"peer{i:04d}", model="m", layers=LayerRange(0, 4),
                                             state=state, throughput=float(i % 50), num_layers=4,
                                             addrs=(f"/ip4/10.0.0.1/tcp/{i}/p2p/peer{i:04d}",))
        signed[f"peer{i:04d}"] = SignedRecord(f"peer{i:04d}".encode(), b"v" * 600, 1e9 + i)
    return SwarmView(model="m", num_layers=4, records=records), signed


def test_view_reply_is_bounded_and_ranked() -> None:
    view, signed = synthetic_view(1000)
    reply = bounded_reply(view, signed)
    assert len(reply.records) == MAX_VIEW_RECORDS and reply.truncated
    assert len(msgpack.packb(reply.to_wire(), use_bin_type=True)) <= MAX_VIEW_BYTES + 1024
    ranked = [view.records[r.subkey.decode()] for r in reply.records]
    assert all(r.state is PeerState.ONLINE for r in ranked)  # 667 online: all slots go to them
    throughputs = [r.throughput for r in ranked]
    assert throughputs == sorted(throughputs, reverse=True)
    assert parse_reply(reply.to_wire(), Limits(), ViewReply) == reply  # the typed schema round-trips it
    small = bounded_reply(view, signed, max_bytes=4096)  # the byte budget binds before the count
    assert 0 < len(small.records) < 10 and small.truncated
    assert small.records == reply.records[: len(small.records)]
    whole = bounded_reply(*synthetic_view(5))
    assert len(whole.records) == 5 and not whole.truncated
    assert [view.records[r.subkey.decode()].state for r in whole.records][-2:] == [PeerState.OFFLINE] * 2
    del signed["peer0001"]  # a record whose signed value the reader did not keep is never relayed
    assert b"peer0001" not in [r.subkey for r in bounded_reply(view, signed).records]


async def test_view_reads_the_dht_at_most_once_per_cache_period() -> None:
    reads: list[str] = []
    now = [100.0]

    async def fetch(model: str) -> tuple[SwarmView, dict[str, SignedRecord]]:
        reads.append(model)
        return synthetic_view(3)

    service = ViewService(fetch, default_model="m", clock=lambda: now[0])
    replies = await asyncio.gather(*(service.answer(View()) for _ in range(20)))
    assert reads == ["m"] and all(len(r["records"]) == 3 for r in replies)
    await service.answer(View("other"))
    now[0] += 10.0
    await service.answer(View())
    assert reads == ["m", "other", "m"]


# ---- the client's own signature check, against values hivemind signed --------------------------------
def new_signer() -> RecordSigner:
    return RecordSigner(IdentityKey(rsa.generate_private_key(public_exponent=65537, key_size=2048)))


def signed_record(signer: RecordSigner, model: str, record: dict, subkey: str | None = None,
                  ttl: float = 60.0) -> SignedRecord:
    """A record signed exactly as a SwarmNode's DHT signs what it stores (hivemind's DHTNode.store_many)."""
    subkey_bytes = MSGPackSerializer.dumps(subkey or signer.owned(record["peer_id"]))
    plain = DHTRecord(dht_key_bytes(model_key(model)), subkey_bytes, MSGPackSerializer.dumps(record),
                      get_dht_time() + ttl)
    return SignedRecord(subkey_bytes, signer.validator.sign_value(plain), plain.expiration_time)


def peer_of(signer: RecordSigner) -> str:
    return peer_id_of(signer.marker[len("[owner:"):-1].encode())


@pytest.mark.slow  # its fixture may build .venv-interop first; the check itself takes ~1 s
def test_interop_client_checks_signatures_itself(interop_venv: Path) -> None:
    honest, other, stranger = new_signer(), new_signer(), new_signer()
    model = "sig-model"
    def record(signer: RecordSigner, **changes) -> dict:
        return PeerRecord(peer_of(signer), model, LayerRange(0, 4), num_layers=8, **changes).to_dict()
    good = signed_record(honest, model, record(honest, throughput=3.0))
    flipped = bytearray(good.value)
    flipped[flipped.index(b"throughput") + 11] ^= 0x01  # one bit of the signed value's throughput
    entries = {
        "good": good,
        "good_other": signed_record(other, model, record(other)),
        "tampered_byte": SignedRecord(good.subkey, bytes(flipped), good.expiration_time),
        "prolonged": SignedRecord(good.subkey, good.value, good.expiration_time + 30.0),
        # The stranger signs a record for the honest peer with its own key, under the honest peer's name.
        "resigned": signed_record(stranger, model, record(honest), subkey=stranger.owned(peer_of(honest))),
        # ... or keeps the honest owner's subkey and signs with its own key (a signature that cannot verify).
        "wrong_key": SignedRecord(good.subkey, signed_record(stranger, model, record(honest),
                                                             subkey=stranger.owned(peer_of(honest))).value,
                                  good.expiration_time),
        "other_model": signed_record(honest, "another-model", record(honest)),
        "expired": signed_record(honest, model, record(honest), ttl=-5.0),
    }
    reply = ViewReply(model, 8, tuple(entries.values()), truncated=False).to_wire()
    done = subprocess.run([str(interop_venv), str(VERIFIER), "--model", model], capture_output=True, timeout=60,
                          input=msgpack.packb(reply, use_bin_type=True))
    assert done.returncode == 0, done.stderr.decode()[-2000:]
    out = json.loads(done.stdout)
    assert [r["peer_id"] for r in out["accepted"]] == [peer_of(honest), peer_of(other)]
    assert out["accepted"][0]["throughput"] == 3.0
    # Why each bad entry was dropped, in order: tampered_byte, prolonged, resigned, wrong_key, other_model, expired.
    why = ["does not verify", "does not verify", "subkey names", "does not verify", "does not verify", "expiration"]
    assert len(out["rejected"]) == len(why) and all(w in r for w, r in zip(why, out["rejected"])), out["rejected"]
    # layerswarm's reader (hivemind's validators, then "the key is the peer named") agrees, entry by entry.
    def kept(entry: SignedRecord) -> bool:
        opened = open_signed(model_key(model), entry, honest)
        return opened is not None and owner_of(opened[0]) == (opened[1]["peer_id"], opened[1]["peer_id"])
    assert [name for name, entry in entries.items() if kept(entry)] == ["good", "good_other"]
