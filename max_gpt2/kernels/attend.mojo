# What gpt2_cached_attention and gpt2_paged_attention share: one (request, head)'s causal
# attention over its cached keys and values, wherever the cache keeps them, and how the
# (request, head) pairs are split between threads.
#
# A request's positions lie page by page: position t on page pages[t // page_size], slot
# t % page_size; its key at head + pages[t // page_size] * page_stride + slot * slot_stride
# and its value value_offset further on. MAX's paged cache has many pages; our own
# [2, B, H, M, d] cache is one page of M slots, d apart. The cache holds CT: float32, or float16
# (half the bytes a step reads; widened to float32 as they are loaded, sums in float32).
from std.math import exp, sqrt
from std.collections import Array
from std.memory import UnsafePointer
from std.sys.info import CompilationTarget, size_of
from std.sys.intrinsics import PrefetchOptions, prefetch

comptime F32 = DType.float32
comptime LANES = 16  # float32 lanes of an AVX-512 register
comptime ROW = 64  # GPT-2's head size at every scale: a query and the output kept in registers
comptime KEYS = 16  # keys a query is dotted with at once (head size ROW): one score a lane
comptime TASKS = 8  # chunks of (request, head) pairs, when the work is worth more than one thread
# Key-dimension products (H * new * seen * d, summed) under which one thread does it all: higher
# thresholds left a batch's attention on one thread while the others waited, and this one measured
# the fastest of those tried (docs/performance.md).
comptime SERIAL_BELOW = 1 << 15


def attention_chunks(work: Int, pairs: Int) -> Int:
    """How many chunks `pairs` (request, head) pairs doing `work` key-dimension products are split into:
    1 (this thread) when waking the others costs more than they save."""
    return 1 if work < SERIAL_BELOW else min(pairs, TASKS)


struct HeadCache[CT: DType](ImplicitlyCopyable):
    """Where one (request, head)'s keys and values, of dtype CT, lie (see the top of this file)."""

    var head: Int  # the address of slot 0 of page 0's key
    var pages: UnsafePointer[UInt32, MutUntrackedOrigin]  # the request's pages, in order
    var page_size: Int
    var page_stride: Int
    var slot_stride: Int
    var value_offset: Int

    def __init__(
        out self,
        head: UnsafePointer[Scalar[Self.CT], MutAnyOrigin],
        pages: UnsafePointer[UInt32, ImmutAnyOrigin],
        page_size: Int,
        page_stride: Int,
        slot_stride: Int,
        value_offset: Int,
    ):
        self.head = Int(head)
        self.pages = UnsafePointer[UInt32, MutUntrackedOrigin](unsafe_from_address=Int(pages))
        self.page_size, self.page_stride, self.slot_stride, self.value_offset = page_size, page_stride, slot_stride, value_offset

    @always_inline
    def key(self, position: Int) -> UnsafePointer[Scalar[Self.CT], MutAnyOrigin]:
        """Where the key of `position` lies (its value: `value_offset` on)."""
        var page = Int(self.pages[position // self.page_size])
        var slot = page * self.page_stride + (position % self.page_size) * self.slot_stride
        return UnsafePointer[Scalar[Self.CT], MutAnyOrigin](unsafe_from_address=self.head) + slot


@always_inline
def _dot[W: Int, CT: DType](a: UnsafePointer[Float32, ImmutAnyOrigin], b: UnsafePointer[Scalar[CT], MutAnyOrigin], n: Int) -> Float32:
    """A . b over n values; W > 0: n == W, in registers."""
    comptime if W > 0:
        return (a.load[width=W]() * b.load[width=W]().cast[F32]()).reduce_add()
    var acc = SIMD[F32, LANES](0)
    var i = 0
    while i + LANES <= n:
        acc = (a + i).load[width=LANES]().fma((b + i).load[width=LANES]().cast[F32](), acc)
        i += LANES
    var total = acc.reduce_add()
    while i < n:
        total += a[i] * b[i].cast[F32]()
        i += 1
    return total


@always_inline
def _fold[s: Int](x: SIMD[F32, LANES], y: SIMD[F32, LANES]) -> SIMD[F32, LANES]:
    """x then y hold keys' partial sums in segments of s lanes, a key a segment: the same keys in
    segments of s / 2, each the sum of its segment's two halves."""
    comptime if s == 16:
        return x.shuffle[0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23](y) + x.shuffle[8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27, 28, 29, 30, 31](y)
    elif s == 8:
        return x.shuffle[0, 1, 2, 3, 8, 9, 10, 11, 16, 17, 18, 19, 24, 25, 26, 27](y) + x.shuffle[4, 5, 6, 7, 12, 13, 14, 15, 20, 21, 22, 23, 28, 29, 30, 31](y)
    elif s == 4:
        return x.shuffle[0, 1, 4, 5, 8, 9, 12, 13, 16, 17, 20, 21, 24, 25, 28, 29](y) + x.shuffle[2, 3, 6, 7, 10, 11, 14, 15, 18, 19, 22, 23, 26, 27, 30, 31](y)
    else:
        comptime assert s == 2, "segments of 16, 8, 4 or 2 lanes"
        return x.shuffle[0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30](y) + x.shuffle[1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31](y)


@always_inline
def _key_dots[CT: DType](query: UnsafePointer[Float32, ImmutAnyOrigin], key: UnsafePointer[Scalar[CT], MutAnyOrigin], slot_stride: Int) -> SIMD[F32, KEYS]:
    """query . key for `KEYS` keys slot_stride apart, ROW values each: lane i, key i. Each key's
    products are summed into one register's lanes, and the 16 registers folded together, 3
    operations a key, where a horizontal sum a key takes 8 (docs/performance.md)."""
    comptime assert KEYS == LANES and ROW == 4 * LANES, "a key a lane, a key in 4 registers"
    var sums = Array[SIMD[F32, LANES], KEYS](uninitialized=True)
    comptime for i in range(KEYS):
        var k = key + i * slot_stride
        var total = query.load[width=LANES]() * k.load[width=LANES]().cast[F32]()
        comptime for c in range(1, 4):
            total = (query + c * LANES).load[width=LANES]().fma((k + c * LANES).load[width=LANES]().cast[F32](), total)
        sums[i] = total
    comptime for level in range(4):  # segments of 16, 8, 4, then 2 lanes
        comptime for j in range(KEYS >> (level + 1)):
            sums[j] = _fold[16 >> level](sums[2 * j], sums[2 * j + 1])
    return sums[0]


@always_inline
def _add_scaled[CT: DType](weight: Float32, x: UnsafePointer[Scalar[CT], MutAnyOrigin], y: UnsafePointer[Float32, MutUntrackedOrigin], n: Int):
    """Y += weight * x over n values."""
    var i = 0
    while i + LANES <= n:
        (y + i).store((x + i).load[width=LANES]().cast[F32]().fma(SIMD[F32, LANES](weight), (y + i).load[width=LANES]()))
        i += LANES
    while i < n:
        y[i] += weight * x[i].cast[F32]()
        i += 1


@always_inline
def _softmax_weights(scores: UnsafePointer[Float32, MutUntrackedOrigin], n: Int, top: Float32) -> Float32:
    """Scores[i] <- exp(scores[i] - top) for i < n; returns their sum."""
    var sums = SIMD[F32, LANES](0)
    var i = 0
    while i + LANES <= n:
        var weights = exp((scores + i).load[width=LANES]() - top)
        (scores + i).store(weights)
        sums += weights
        i += LANES
    var total = sums.reduce_add()
    while i < n:
        scores[i] = exp(scores[i] - top)
        total += scores[i]
        i += 1
    return total


@always_inline
def _request_positions[CT: DType](cache: HeadCache[CT], seen: Int, first: Int, count: Int, d: Int, offset: Int):
    """Requests into L2 the keys (offset 0) or values (offset `value_offset`) of positions
    first..first + count - 1 of `cache`, those below `seen`."""
    comptime into_l2 = PrefetchOptions().for_read().low_locality()
    for t in range(first, min(first + count, seen)):
        var at = Int(cache.key(t) + offset)
        for line in range(0, d * size_of[CT](), 64):
            prefetch[into_l2](UnsafePointer[UInt8, MutAnyOrigin](unsafe_from_address=at + line))


def attend_head[
    W: Int, CT: DType
](
    cache: HeadCache[CT],
    qkv: UnsafePointer[Float32, ImmutAnyOrigin],
    y: UnsafePointer[Float32, MutAnyOrigin],
    key_bias: UnsafePointer[Float32, ImmutAnyOrigin],
    has_key_bias: Bool,
    new: Int,
    past: Int,
    D: Int,
    d: Int,
    scratch: UnsafePointer[Float32, MutUntrackedOrigin],
    next_head: HeadCache[CT],
    next_seen: Int,
):
    """One (request, head): stores its `new` keys and values at positions past.., then attends each query.

    qkv: this head's query in the request's first new row of [*, 3D] (its key D on, its value 2D on);
    y: this head's output in the first row of [*, D]; key_bias [past + new] (when has_key_bias):
    added to each key's score; scratch: past + new + d floats. W = d when d is `ROW`, else 0.
    next_head: the pair this thread attends next, whose first `next_seen` keys and values (0: none)
    are requested while the last query reads this pair's, so that they are on their way when it
    starts (the keys in the AVX-512 loop over `KEYS` keys, the values where W > 0).
    """
    var scale = 1 / sqrt(Float32(d))
    for s in range(new):
        var source = qkv + s * 3 * D
        var key = cache.key(past + s)
        var i = 0
        while i + LANES <= d:
            (key + i).store((source + D + i).load[width=LANES]().cast[CT]())
            (key + cache.value_offset + i).store((source + 2 * D + i).load[width=LANES]().cast[CT]())
            i += LANES
        while i < d:
            key[i] = source[D + i].cast[CT]()
            key[cache.value_offset + i] = source[2 * D + i].cast[CT]()
            i += 1
    var scores = scratch  # [seen]
    var out = scratch + past + new  # [d], where W is 0
    for s in range(new):
        var query = qkv + s * 3 * D
        var seen = past + s + 1
        var requested = next_seen if s == new - 1 else 0  # the last query reads every position
        var top = Float32.MIN
        var start = 0
        while start < seen:  # a page at a time: its keys lie slot_stride apart
            var key = cache.key(start)
            var end = min(seen, start + cache.page_size)
            var t = start
            comptime if W == ROW and CompilationTarget.has_avx512f():  # AVX2's shuffles span two registers: not measured
                var tops = SIMD[F32, KEYS](Float32.MIN)
                while t + KEYS <= end:
                    _request_positions[CT](next_head, requested, t, KEYS, d, 0)
                    var some = _key_dots[CT](query, key, cache.slot_stride) * scale
                    if has_key_bias:
                        some += (key_bias + t).load[width=KEYS]()
                    (scores + t).store(some)
                    tops = max(tops, some)
                    key += KEYS * cache.slot_stride
                    t += KEYS
                top = max(top, tops.reduce_max())
            for rest in range(t, end):
                var score = _dot[W, CT](query, key, d) * scale
                if has_key_bias:
                    score += key_bias[rest]
                scores[rest] = score
                top = max(top, score)
                key += cache.slot_stride
            start += cache.page_size
        var total = _softmax_weights(scores, seen, top)
        var row = y + s * D
        comptime if W > 0:
            var acc = SIMD[F32, W](0)  # in registers: no store and reload of the sum per key
            start = 0
            while start < seen:
                var value = cache.key(start) + cache.value_offset
                for t in range(start, min(seen, start + cache.page_size)):
                    _request_positions[CT](next_head, requested, t, 1, d, next_head.value_offset)
                    acc = value.load[width=W]().cast[F32]().fma(SIMD[F32, W](scores[t]), acc)
                    value += cache.slot_stride
                start += cache.page_size
            row.store(acc / total)
        else:
            for i in range(d):
                out[i] = 0
            start = 0
            while start < seen:
                var value = cache.key(start) + cache.value_offset
                for t in range(start, min(seen, start + cache.page_size)):
                    _add_scaled[CT](scores[t], value, out, d)
                    value += cache.slot_stride
                start += cache.page_size
            for i in range(d):
                row[i] = out[i] / total
