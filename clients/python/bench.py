"""Decisions per second of Limiter.try_acquire on a granted group, against a running server:
``python bench.py http://127.0.0.1:7460``. Prints the median of five one-second runs."""

import statistics
import sys
import time

import tollgate


def main(url: str) -> None:
    with tollgate.Admin(url) as admin:
        admin.put_group("py-bench", limit="unlimited")
    with tollgate.Limiter(url) as limiter:
        while True:
            try:
                limiter.try_acquire("py-bench", 0)
                break
            except tollgate.Throttled:
                time.sleep(0.01)
        runs = []
        for _ in range(5):
            n, start = 0, time.perf_counter()
            while time.perf_counter() - start < 1.0:
                for _ in range(1000):
                    limiter.try_acquire("py-bench", 1)
                n += 1000
            runs.append(n / (time.perf_counter() - start))
        print(f"try_acquire: median {statistics.median(runs):,.0f} decisions/s of {[round(r) for r in runs]}")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "http://127.0.0.1:7460")
