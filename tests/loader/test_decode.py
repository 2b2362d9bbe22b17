"""Decoding only what is used, exactly: crops start at the keyframe before them, strides skip
non-reference frames and still give exactly the wanted frames; audio as float32 PCM; backend choice."""

from __future__ import annotations

import re
import subprocess
import sys

import numpy as np
import pytest

from dsbuild.core.errors import MissingDependency, MissingDevice, UsageError
from dsbuild.formats.probe import decoder_threads, usable_cores
from dsbuild.loader import Loader
from dsbuild.loader.audio import decode_audio
from dsbuild.loader.backends import NVDEC, choose_backend, probe
from dsbuild.loader.decode import decode_pyav, start_packet
from tests.loader.conftest import make_clip


@pytest.fixture(scope="module")
def clip() -> bytes:
    return make_clip()


def all_frames(data: bytes) -> np.ndarray:
    return decode_pyav(data, np.arange(60))


def test_any_frames_decode_exactly_as_in_a_full_decode(clip):
    full = all_frames(clip)
    assert len(full) == 60 and len({int(f[-1, -1, 0]) for f in full}) > 30
    for idx in ([0], [23, 25, 27], [59], list(range(40, 60, 3)), [9, 10, 11]):
        assert np.array_equal(decode_pyav(clip, np.array(idx)), full[idx])


def test_decoding_threads_change_no_frame(clip):
    """Each of N decoders at once gets its share of the cores (one thread each here, as two workers on
    two cores get): the frames are the same whatever the threads."""
    full = decode_pyav(clip, np.arange(60))
    for threads in (1, 2, 3):
        assert np.array_equal(decode_pyav(clip, np.arange(60), threads=threads), full)


def test_the_cores_are_shared_out_among_the_decoders_of_a_node(monkeypatch):
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    cores = usable_cores()
    assert decoder_threads(1) == 0  # a lone decoder: FFmpeg's own choice, a thread per core
    for n in (2, 3, 8, 64):
        assert decoder_threads(n) == max(1, cores // n) and decoder_threads(n) * min(n, cores) <= cores
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "4")  # torchrun's: four ranks of the node decode too
    assert decoder_threads(1) == max(1, cores // 4) and decoder_threads(2) == max(1, cores // 8)
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "x")
    assert decoder_threads(1) == 0


@pytest.mark.parametrize("size", [None, (24, 40), (97, 33)])
def test_frames_are_pyavs_own_conversion_of_each_frame(clip, size):
    """One scaler per clip (a speed-up) gives the bytes of PyAV's per-frame ``to_ndarray``."""
    import io

    import av

    kw = {"format": "rgb24"} if size is None else {"format": "rgb24", "width": size[1], "height": size[0]}
    with av.open(io.BytesIO(clip)) as c:
        want = np.stack([f.to_ndarray(**kw) for f in c.decode(c.streams.video[0])])
    assert np.array_equal(decode_pyav(clip, np.arange(len(want)), size), want)


def test_a_crop_decodes_from_the_keyframe_before_it_not_from_frame_0(clip):
    counts: dict = {}
    decode_pyav(clip, np.array([45, 46, 47]), counts=counts)
    # at most the packets from the start keyframe on were decoded (frame threads may run ahead of the
    # wanted frames, by more on more cores, but never back before the keyframe)
    assert counts["skipped_packets"] >= 40 and counts["decoded"] <= 60 - counts["skipped_packets"]
    full: dict = {}
    decode_pyav(clip, np.arange(60), counts=full)
    assert full["skipped_packets"] == 0 and full["decoded"] == 60


def test_the_start_packet_is_the_last_keyframe_at_or_before_the_first_frame():
    packets = [(0, True), (3, False), (1, False), (2, False), (6, True), (4, False), (5, False)]  # decode order
    assert [start_packet(packets, p) for p in range(8)] == [0, 0, 0, 0, 0, 0, 4, 4]


def test_a_stride_skips_non_reference_frames_and_gives_exactly_the_strided_frames(clip):
    full = all_frames(clip)
    counts: dict = {}
    for stride in (2, 3):
        idx = np.arange(0, 60, stride)
        got = decode_pyav(clip, idx, skip_nonref=True, counts=counts)
        assert np.array_equal(got, full[idx])
    # with B-frames every third frame, a stride of 3 from frame 0 needs only I/P frames: the B-frames are skipped
    only_refs: dict = {}
    decode_pyav(clip, np.arange(0, 60, 3), skip_nonref=True, counts=only_refs)
    assert only_refs["decoded"] < 60


def test_resize_goes_through_swscale(clip):
    got = decode_pyav(clip, np.array([1, 2]), size=(24, 32))
    assert got.shape == (2, 24, 32, 3) and got.dtype == np.uint8


def test_audio_is_float32_pcm_at_the_asked_rate_and_deterministic(clip):
    mono = decode_audio(clip, 16000, 1)
    assert mono.dtype == np.float32 and mono.shape[0] == 1 and abs(mono.shape[1] - 32000) < 2048
    assert np.array_equal(mono, decode_audio(clip, 16000, 1))
    spectrum = np.abs(np.fft.rfft(mono[0, 4000:20000]))
    assert abs(np.argmax(spectrum) * 16000 / 16000 - 440) < 5  # the 440 Hz tone survives resampling
    assert decode_audio(clip, 22050, 2).shape[0] == 2
    assert decode_audio(make_clip(audio=False, frames=10), 16000, 1).shape == (1, 0)


def test_the_loader_delivers_audio_with_lengths(cat):
    ref, _ = cat
    b = next(iter(Loader(ref, decode="bytes", batch_size=3, seed=1, audio=True)))
    assert b["audio"].dtype == np.float32 and b["audio"].shape[:2] == (3, 1) and len(b["audio_lengths"]) == 3
    assert b["audio"].shape[2] == max(b["audio_lengths"])  # padded to the longest (0 for clips without audio)


def test_strided_frames_keep_the_audio_of_the_whole_span(cat):
    """Each kept frame stands for frame_stride frames: the audio was cut at the last kept frame plus one
    frame's time (a 1-s clip at stride 2 gave 0.967 s)."""
    ref, _ = cat
    whole = next(iter(Loader(ref, batch_size=4, seed=1, audio=True, resize=(8, 8), shuffle="none")))
    strided = next(iter(Loader(ref, batch_size=4, seed=1, audio=True, resize=(8, 8), shuffle="none", frame_stride=2)))
    assert whole["keys"] == strided["keys"]
    for full, cut in zip(whole["audio_lengths"], strided["audio_lengths"]):
        if full:  # (a clip without audio has none either way)
            assert abs(int(cut) - int(full)) <= 0.03 * 16000, (cut, full)  # within an audio frame or so


def test_a_crops_audio_span_follows_the_frames_when_the_rate_label_is_nominal(cat):
    """A variable-rate Matroska recording is labelled with its declared rate (60) while its frames come at
    30: the span each kept frame stands for was taken from the label, and a strided crop's audio lost half
    of its last frame's share."""
    from dsbuild.loader.prepare import frame_step

    ref, _ = cat
    kw = dict(batch_size=4, seed=1, audio=True, resize=(8, 8), shuffle="none", frame_stride=2)
    right = next(iter(Loader(ref, **kw)))
    mislabelled = Loader(ref, **kw)
    mislabelled.open().sources[0].fps[:] *= 2  # the nominal rate a container can declare
    assert next(iter(mislabelled))["audio_lengths"].tolist() == right["audio_lengths"].tolist()
    ts = np.arange(10) / 30
    assert frame_step(30.0, ts) == 1 / 30 and frame_step(60.0, ts) == pytest.approx(1 / 30)
    assert frame_step(29.97, ts) == 1 / 29.97 and frame_step(0.0, ts[:1]) == 0.0


@pytest.mark.parametrize(
    "options, message",
    [
        ({"audio_channels": 6}, r"audio_channels must be 1 \(mono\) or 2 \(stereo\)"),  # failed every sample as damage
        ({"device": "mps"}, "device must be"),
        ({"device": "gpu"}, "device must be"),  # (CPU tensors / a torch error)
        ({"resize": (64.5, 64)}, "resize must be"),  # (a TypeError)
        ({"decode": "bytes", "clip_frames": 4}, "need decode='frames'"),  # (rows cut, clip whole: misaligned)
        ({"decode": "bytes", "frame_stride": 2}, "need decode='frames'"),
    ],
)
def test_options_that_cannot_work_are_refused_when_made(cat, options, message):
    ref, _ = cat
    with pytest.raises(UsageError, match=message):
        Loader(ref, **options)


@pytest.mark.parametrize(
    "change, says",
    [
        (lambda s: {**s, "frames": s["frames"][:1]}, "'frames' as uint8 (1,"),  # was broadcast into every slot
        (lambda s: {**s, "frames": s["frames"] / 255.0}, "'frames' as float64"),  # was truncated to zeros
        (lambda s: {**s, "actions": s["actions"][:2]}, "'actions' as float32 (2,"),  # was padded with zeros
        (lambda s: None, "map returned NoneType"),
    ],
)
def test_a_map_that_changes_shapes_or_dtypes_is_refused_naming_the_array(cat, change, says):
    ref, _ = cat
    loader = Loader(ref, batch_size=2, seed=1, resize=(8, 8), map=lambda sample, rng: change(sample))
    with pytest.raises(UsageError, match=re.escape(says)):
        next(iter(loader))
    kept = Loader(ref, batch_size=2, seed=1, resize=(8, 8), map=lambda s, rng: {**s, "frames": 255 - s["frames"]})
    assert next(iter(kept))["frames"].dtype == np.uint8  # values may change


def test_backend_choice_is_pure_and_says_why():
    none, tc, nv = frozenset(), frozenset({"torchcodec"}), frozenset({NVDEC})
    assert choose_backend("pyav", cuda=True, installed=nv).name == "pyav"
    assert choose_backend("auto", cuda=False, installed=nv).name == "pyav"
    assert "no CUDA GPU" in choose_backend("auto", cuda=False, installed=nv).note
    assert "no CUDA hwaccel" in choose_backend("auto", cuda=True, installed=tc).note
    auto = choose_backend("auto", cuda=True, installed=nv)  # a GPU: the probe decides (test_gpu_decode.py)
    assert (auto.name, auto.device) == ("auto", "probe") and "probing NVDEC against PyAV" in auto.note
    assert (choose_backend("nvdec", cuda=True, installed=nv).device) == "cuda"
    assert (choose_backend("torchcodec", cuda=False, installed=tc).device) == "cpu"
    with pytest.raises(MissingDependency, match=r"pip install 'dsbuild\[torchcodec\]'"):
        choose_backend("torchcodec", cuda=True, installed=nv)
    with pytest.raises(MissingDevice, match="needs a CUDA GPU"):
        choose_backend("nvdec", cuda=False, installed=nv)
    with pytest.raises(MissingDevice, match="CUDA hwaccel"):
        choose_backend("nvdec", cuda=True, installed=tc)
    with pytest.raises(UsageError, match="decode_backend must be"):
        choose_backend("vaapi", cuda=True, installed=none)


def test_this_machines_pyav_is_probed_for_the_cuda_hwaccel():
    from av.codec.hwaccel import hwdevices_available

    _cuda, installed = probe()
    assert (NVDEC in installed) == ("cuda" in hwdevices_available())


def test_the_loader_falls_back_to_pyav_on_this_machine_and_says_so(cat):
    ref, _ = cat
    auto = Loader(ref, batch_size=2, seed=1, resize=(8, 8), decode_backend="auto")
    pyav = Loader(ref, batch_size=2, seed=1, resize=(8, 8))
    a, p = next(iter(auto)), next(iter(pyav))
    assert np.array_equal(a["frames"], p["frames"])
    assert any(n.startswith("auto:") for n in auto.stats()["notes"]) and auto.backend.name == "pyav"


def test_device_auto_without_torch_delivers_numpy_with_a_note(cat):
    ref, _ = cat
    script = (
        "import sys; sys.modules['torch'] = None\n"
        "import numpy as np\nfrom dsbuild.loader import Loader\n"
        f"L = Loader({ref!r}, decode='bytes', batch_size=2, device='auto')\n"
        "b = next(iter(L)); assert isinstance(b['actions'], np.ndarray)\n"
        "print(L.stats()['notes'])\n"
    )
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert "torch is not installed" in r.stdout


@pytest.mark.parametrize(
    "options",
    [
        {"resize": (16, 24)},
        {"bucket_by": "resolution"},
        {"resize": (16, 24), "clip_frames": 5, "frame_stride": 2},
        {"resize": (16, 24), "pack_frames": 40},
    ],
)
def test_batches_hold_each_clips_own_frames_then_zeros(cat, options):
    """Frames decoded straight into the batch (or copied there, when packing) are PyAV's frames of the
    sample's own clip, and the padding after them is zero: across two epochs of reused memory."""
    import io

    import av

    ref, _ = cat
    clips = {
        k: bytes(v)
        for b in Loader(ref, decode="bytes", batch_size=4, verify="none")
        for k, v in zip(b["keys"], b["video"])
    }
    loader = Loader(ref, batch_size=3, seed=2, **options)
    size = options.get("resize")
    kw = {"format": "rgb24"} if size is None else {"format": "rgb24", "width": size[1], "height": size[0]}
    checked = 0
    for _ in range(2):
        for b in loader:
            rows = b.get("segment_ids")
            keys = [k for item in b["keys"] for k in item] if rows is not None else b["keys"]
            for i, key in enumerate(keys):
                with av.open(io.BytesIO(clips[key])) as c:
                    full = np.stack([f.to_ndarray(**kw) for f in c.decode(c.streams.video[0])])
                if rows is None:
                    n = int(b["lengths"][i])
                    got = b["frames"][i, :n]
                else:  # packed: sample k of item j is where segment_ids == k
                    j = next(j for j, item in enumerate(b["keys"]) if key in item)
                    k = b["keys"][j].index(key)
                    got = b["frames"][j][rows[j] == k]
                stride = options.get("frame_stride", 1)
                assert any(np.array_equal(got, full[s::stride][: len(got)]) for s in range(len(full))), key
                checked += 1
            if rows is None:
                for i in range(len(keys)):
                    assert not b["frames"][i, int(b["lengths"][i]) :].any()
            else:
                for j in range(len(b["keys"])):
                    assert not b["frames"][j][rows[j] < 0].any()
    assert checked == 2 * len(clips)  # every sample, in both epochs
