// Times oneCCL's allreduce (sum, out of place, float32 or bfloat16) the way mpi_allreduce.c times
// MPI_Allreduce: per size WARMUP untimed calls, a barrier, ITERS timed calls, the time the maximum
// over ranks, busbw = bytes / time * 2(n-1)/n (GB = 1e9 bytes), every size checked once.
// Usage, one process per rank under a PMI launcher (Intel MPI's mpiexec.hydra, which sets
// PMI_RANK and PMI_SIZE):
//   oneccl_allreduce KVS_FILE MIN_BYTES MAX_BYTES FACTOR ITERS WARMUP [float|bf16]
// KVS_FILE: a path no file has yet; rank 0 publishes oneCCL's rendezvous address there (oneCCL
// needs one address handed to every rank, and a file keeps that off any network).
// Prints one line per size, "bytes time_us busbw_GBps check"; rank 0 names the library on stderr.
// Build: g++ -O2 -std=c++17 -I PREFIX/include oneccl_allreduce.cpp -L PREFIX/lib -lccl
//        -l:libintlc.so.5 -Wl,-rpath,PREFIX/lib (libccl uses Intel's libintlc without naming it).
#include <oneapi/ccl.hpp>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

namespace {

int env_int(const char* name) {
    const char* v = std::getenv(name);
    if (!v || !*v) {
        std::fprintf(stderr, "oneccl_allreduce: %s is not set (run under mpiexec.hydra)\n", name);
        std::exit(2);
    }
    return std::atoi(v);
}

ccl::shared_ptr_class<ccl::kvs> rendezvous(int rank, const std::string& path) {
    if (rank == 0) {
        auto kvs = ccl::create_main_kvs();
        auto addr = kvs->get_address();
        // Written whole under another name, then renamed: the others never read half of it.
        std::string tmp = path + ".part";
        std::ofstream(tmp, std::ios::binary).write(addr.data(), addr.size());
        if (std::rename(tmp.c_str(), path.c_str()) != 0) {
            std::perror("oneccl_allreduce: publishing the KVS address");
            std::exit(1);
        }
        return kvs;
    }
    ccl::kvs::address_type addr{};
    auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    for (;;) {
        std::ifstream f(path, std::ios::binary);
        if (f && f.read(addr.data(), addr.size()) && size_t(f.gcount()) == addr.size()) break;
        if (std::chrono::steady_clock::now() > give_up) {
            std::fprintf(stderr, "oneccl_allreduce: rank %d found no address in %s\n", rank, path.c_str());
            std::exit(1);
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
    return ccl::create_kvs(addr);
}

uint16_t to_bf16(float f) {  // exact for the small integers used here
    uint32_t u;
    std::memcpy(&u, &f, 4);
    return uint16_t(u >> 16);
}

float from_bf16(uint16_t h) {
    uint32_t u = uint32_t(h) << 16;
    float f;
    std::memcpy(&f, &u, 4);
    return f;
}

}  // namespace

int main(int argc, char** argv) {
    std::string dtype = argc == 8 ? argv[7] : "float";
    bool bf16 = dtype == "bf16";
    if ((argc != 7 && argc != 8) || (!bf16 && dtype != "float")) {
        std::fprintf(stderr, "usage: %s KVS_FILE MIN MAX FACTOR ITERS WARMUP [float|bf16]\n", argv[0]);
        return 2;
    }
    size_t min = std::strtoull(argv[2], nullptr, 10), max = std::strtoull(argv[3], nullptr, 10);
    size_t factor = std::strtoull(argv[4], nullptr, 10);
    int iters = std::atoi(argv[5]), warmup = std::atoi(argv[6]);
    int rank = env_int("PMI_RANK"), size = env_int("PMI_SIZE");
    try {
        ccl::init();
        auto kvs = rendezvous(rank, argv[1]);
        auto comm = ccl::create_communicator(size, rank, kvs);
        int n = comm.size();
        ccl::datatype type = bf16 ? ccl::datatype::bfloat16 : ccl::datatype::float32;
        size_t esize = bf16 ? 2 : 4;
        if (rank == 0)
            std::fprintf(stderr, "oneccl_allreduce: library: oneCCL %s; %s: ccl::datatype::%s\n",
                         ccl::get_library_version().full, dtype.c_str(), bf16 ? "bfloat16" : "float32");
        std::vector<char> send(max), recv(max);
        float mine = float(rank + 1), want = float(n) * (n + 1) / 2;
        for (size_t i = 0; i < max / esize; i++) {
            if (bf16) reinterpret_cast<uint16_t*>(send.data())[i] = to_bf16(mine);
            else reinterpret_cast<float*>(send.data())[i] = mine;
        }
        auto slowest = [&](double v) {
            double out = 0;
            ccl::allreduce(&v, &out, 1, ccl::datatype::float64, ccl::reduction::max, comm).wait();
            return out;
        };
        for (size_t bytes = min; bytes <= max; bytes *= factor) {
            size_t count = bytes / esize;
            auto call = [&] {
                ccl::allreduce(send.data(), recv.data(), count, type, ccl::reduction::sum, comm).wait();
            };
            for (int i = 0; i < warmup; i++) call();
            ccl::barrier(comm).wait();
            auto t0 = std::chrono::steady_clock::now();
            for (int i = 0; i < iters; i++) call();
            double t = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / iters;
            double tmax = slowest(t);
            bool ok = true;
            for (size_t i = 0; i < count; i++)
                ok &= (bf16 ? from_bf16(reinterpret_cast<uint16_t*>(recv.data())[i])
                            : reinterpret_cast<float*>(recv.data())[i]) == want;
            bool all_ok = slowest(ok ? 0.0 : 1.0) == 0.0;
            if (rank == 0) {
                std::printf("%zu %.3f %.4f %s\n", bytes, tmax * 1e6,
                            tmax > 0 ? bytes / tmax / 1e9 * 2.0 * (n - 1) / n : 0.0, all_ok ? "ok" : "WRONG");
                std::fflush(stdout);
            }
            if (factor <= 1) break;
        }
        ccl::barrier(comm).wait();
    } catch (const std::exception& e) {
        std::fprintf(stderr, "oneccl_allreduce: rank %d: %s\n", rank, e.what());
        return 1;
    }
    return 0;
}
