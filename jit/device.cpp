#include "jit/device.h"

#include <atomic>

#include <fmt/format.h>

#include "jit/cuda_driver.h"
#include "jit/env_flags.h"
#include "jit/grid_dependency.h"

namespace gj::jit {

struct Device::Impl {
    int ordinal = 0;
    CUdevice dev = 0;
    CUcontext ctx = nullptr;
    CUstream stream = nullptr;
    std::string name;
    int cc = 0;
    int sm_count = 0;
    int smem_optin = 0;
    size_t total_mem = 0;
    int low_priority = 0, high_priority = 0;  // stream priorities (numerically low is high)
};

namespace {
// Device::select's ordinal; -1: GEMMAJIT_DEVICE's.
std::atomic<int> selected_ordinal{-1};
std::atomic<bool> device_created{false};
}  // namespace

void Device::select(int ordinal) {
    if (device_created.load())
        throw std::logic_error("Device::select after the device was created");
    selected_ordinal.store(ordinal);
}

Device::Device() : impl_(std::make_unique<Impl>()) {
    const DriverApi& api = driver();
    int count = 0;
    check_driver(api.cuDeviceGetCount(&count), "cuDeviceGetCount");
    const int selected = selected_ordinal.load();
    impl_->ordinal =
        selected >= 0 ? selected : static_cast<int>(Flags::process().get_int("GEMMAJIT_DEVICE"));
    if (impl_->ordinal >= count)
        throw DeviceUnavailable(
            selected >= 0
                ? fmt::format("this process needs CUDA device {} but only {} device{} exist",
                              impl_->ordinal, count, count == 1 ? "" : "s")
                : fmt::format("GEMMAJIT_DEVICE={} but only {} CUDA device{} exist", impl_->ordinal,
                              count, count == 1 ? "" : "s"));
    check_driver(api.cuDeviceGet(&impl_->dev, impl_->ordinal), "cuDeviceGet");
    char name[256] = {};
    check_driver(api.cuDeviceGetName(name, sizeof name, impl_->dev), "cuDeviceGetName");
    impl_->name = name;
    int major = 0, minor = 0;
    check_driver(
        api.cuDeviceGetAttribute(&major, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, impl_->dev),
        "cuDeviceGetAttribute(COMPUTE_CAPABILITY_MAJOR)");
    check_driver(
        api.cuDeviceGetAttribute(&minor, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, impl_->dev),
        "cuDeviceGetAttribute(COMPUTE_CAPABILITY_MINOR)");
    impl_->cc = major * 10 + minor;
    check_driver(api.cuDeviceGetAttribute(&impl_->sm_count,
                                          CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, impl_->dev),
                 "cuDeviceGetAttribute(MULTIPROCESSOR_COUNT)");
    check_driver(
        api.cuDeviceGetAttribute(&impl_->smem_optin,
                                 CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN, impl_->dev),
        "cuDeviceGetAttribute(MAX_SHARED_MEMORY_PER_BLOCK_OPTIN)");
    check_driver(api.cuDeviceTotalMem(&impl_->total_mem, impl_->dev), "cuDeviceTotalMem");
    check_driver(api.cuDevicePrimaryCtxRetain(&impl_->ctx, impl_->dev), "cuDevicePrimaryCtxRetain");
    check_driver(api.cuCtxSetCurrent(impl_->ctx), "cuCtxSetCurrent");
    // The compute stream takes the highest priority, so that background work (the prefill's
    // weight dequantization, on a stream of the lowest) fills the SMs the compute kernels leave
    // idle instead of taking them first.
    check_driver(api.cuCtxGetStreamPriorityRange(&impl_->low_priority, &impl_->high_priority),
                 "cuCtxGetStreamPriorityRange");
    check_driver(api.cuStreamCreateWithPriority(&impl_->stream, CU_STREAM_NON_BLOCKING,
                                                impl_->high_priority),
                 "cuStreamCreateWithPriority");
}

CUstream Device::create_stream(bool background) const {
    CUstream s = nullptr;
    check_driver(
        driver().cuStreamCreateWithPriority(
            &s, CU_STREAM_NON_BLOCKING, background ? impl_->low_priority : impl_->high_priority),
        background ? "cuStreamCreateWithPriority(background stream)"
                   : "cuStreamCreateWithPriority(side stream)");
    return s;
}

Device& Device::get() {
    // Created on first use and deliberately never destroyed: modules, buffers and graphs owned by
    // other statics may outlive it at exit, and the driver releases everything with the process.
    static Device* device = [] {
        device_created.store(true);
        return new Device();
    }();
    return *device;
}

std::string Device::name() const {
    return impl_->name;
}
std::string Device::arch() const {
    return fmt::format("sm_{}", impl_->cc);
}
int Device::sm_count() const {
    return impl_->sm_count;
}
int Device::compute_capability() const {
    return impl_->cc;
}
int Device::max_shared_per_block_optin() const {
    return impl_->smem_optin;
}
int Device::driver_version() const {
    return driver().driver_version;
}
size_t Device::total_memory() const {
    return impl_->total_mem;
}

size_t Device::free_memory() const {
    make_current();
    size_t free = 0, total = 0;
    check_driver(driver().cuMemGetInfo(&free, &total), "cuMemGetInfo");
    return free;
}

CUstream Device::stream() const {
    return impl_->stream;
}

void Device::make_current() const {
    check_driver(driver().cuCtxSetCurrent(impl_->ctx), "cuCtxSetCurrent");
}

void Device::synchronize() const {
    make_current();
    check_driver(driver().cuCtxSynchronize(), "cuCtxSynchronize");
}

namespace {
std::atomic<uint64_t> g_live_bytes{0};  // held by every DeviceBuffer of the process
}  // namespace

uint64_t DeviceBuffer::live_bytes() {
    return g_live_bytes.load();
}

DeviceBuffer::DeviceBuffer(size_t bytes) : size_(bytes) {
    Device::get().make_current();
    if (bytes == 0) return;
    check_driver(driver().cuMemAlloc(&ptr_, bytes), fmt::format("cuMemAlloc({} bytes)", bytes));
    g_live_bytes += bytes;
}

DeviceBuffer::~DeviceBuffer() {
    if (!ptr_) return;
    driver().cuMemFree(ptr_);  // nothing useful to do with an error in a destructor
    g_live_bytes -= size_;
}

DeviceBuffer::DeviceBuffer(DeviceBuffer&& o) noexcept : ptr_(o.ptr_), size_(o.size_) {
    o.ptr_ = 0;
    o.size_ = 0;
}

DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& o) noexcept {
    if (this != &o) {
        if (ptr_) {
            driver().cuMemFree(ptr_);
            g_live_bytes -= size_;
        }
        ptr_ = o.ptr_;
        size_ = o.size_;
        o.ptr_ = 0;
        o.size_ = 0;
    }
    return *this;
}

namespace {
void check_range(size_t offset, size_t bytes, size_t size, const char* what) {
    if (offset > size || bytes > size - offset)
        throw std::out_of_range(
            fmt::format("DeviceBuffer::{}: {} bytes at offset {} exceed the "
                        "{}-byte buffer",
                        what, bytes, offset, size));
}
}  // namespace

// The synchronous copies and memsets run on the engine's stream and wait for it. The legacy
// cuMemcpyHtoD/cuMemsetD8 would run on the NULL stream, which the engine's non-blocking stream
// does not order against: a kernel could read a half-uploaded buffer, and a download could read
// results a kernel has not written yet. (A pageable HtoD copy may also return before its DMA
// lands.)
void DeviceBuffer::upload(const void* src, size_t bytes, size_t offset) {
    check_range(offset, bytes, size_, "upload");
    if (bytes == 0) return;
    const Device& dev = Device::get();
    dev.make_current();
    check_driver(driver().cuMemcpyHtoDAsync(ptr_ + offset, src, bytes, dev.stream()),
                 "cuMemcpyHtoDAsync");
    check_driver(driver().cuStreamSynchronize(dev.stream()), "cuStreamSynchronize after upload");
}

void DeviceBuffer::download(void* dst, size_t bytes, size_t offset) const {
    check_range(offset, bytes, size_, "download");
    if (bytes == 0) return;
    const Device& dev = Device::get();
    dev.make_current();
    check_driver(driver().cuMemcpyDtoHAsync(dst, ptr_ + offset, bytes, dev.stream()),
                 "cuMemcpyDtoHAsync");
    check_driver(driver().cuStreamSynchronize(dev.stream()), "cuStreamSynchronize after download");
}

void DeviceBuffer::zero() {
    if (size_ == 0) return;
    const Device& dev = Device::get();
    dev.make_current();
    check_driver(driver().cuMemsetD8Async(ptr_, 0, size_, dev.stream()), "cuMemsetD8Async");
    check_driver(driver().cuStreamSynchronize(dev.stream()), "cuStreamSynchronize after memset");
}

void Kernel::set_max_dynamic_smem(int bytes) {
    int limit = Device::get().max_shared_per_block_optin();
    if (bytes > limit)
        throw DeviceError(
            fmt::format("kernel {}: {} bytes of dynamic shared memory exceed the "
                        "device's limit of {}",
                        name_, bytes, limit));
    check_driver(
        driver().cuFuncSetAttribute(fn_, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, bytes),
        fmt::format("cuFuncSetAttribute(MAX_DYNAMIC_SHARED_SIZE_BYTES={}) for kernel {}", bytes,
                    name_));
    max_dyn_smem_ = std::max(bytes, 48 * 1024);
}

int Kernel::attribute(CUfunction_attribute attr) const {
    int v = 0;
    check_driver(
        driver().cuFuncGetAttribute(&v, attr, fn_),
        fmt::format("cuFuncGetAttribute({}) for kernel {}", static_cast<int>(attr), name_));
    return v;
}

void Kernel::launch(LaunchDims grid, LaunchDims block, unsigned dyn_smem, CUstream stream,
                    void** args, bool dependent) const {
    if (!fn_) throw DeviceError("launch of an unloaded kernel");
    if (dyn_smem > static_cast<unsigned>(max_dyn_smem_))
        throw DeviceError(
            fmt::format("kernel {}: launch asks for {} bytes of dynamic shared "
                        "memory but only {} were opted into (set_max_dynamic_smem "
                        "before capture)",
                        name_, dyn_smem, max_dyn_smem_));
    CUresult r;
    if (dependent && waits_on_grid_) {
        CUlaunchAttribute attr{};
        attr.id = CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION;
        attr.value.programmaticStreamSerializationAllowed = 1;
        CUlaunchConfig cfg{};
        cfg.gridDimX = grid.x;
        cfg.gridDimY = grid.y;
        cfg.gridDimZ = grid.z;
        cfg.blockDimX = block.x;
        cfg.blockDimY = block.y;
        cfg.blockDimZ = block.z;
        cfg.sharedMemBytes = dyn_smem;
        cfg.hStream = stream;
        cfg.attrs = &attr;
        cfg.numAttrs = 1;
        r = driver().cuLaunchKernelEx(&cfg, fn_, args, nullptr);
    } else {
        r = driver().cuLaunchKernel(fn_, grid.x, grid.y, grid.z, block.x, block.y, block.z,
                                    dyn_smem, stream, args, nullptr);
    }
    if (r != CUDA_SUCCESS)
        throw DeviceError(
            fmt::format("launching kernel {} (grid {}x{}x{}, block {}x{}x{}, {} B "
                        "dynamic smem): {}",
                        name_, grid.x, grid.y, grid.z, block.x, block.y, block.z, dyn_smem,
                        driver_error_text(r)));
}

ModuleSet::~ModuleSet() {
    if (modules_.empty() || !device_available()) return;
    Device::get().make_current();
    for (CUmodule m : modules_) driver().cuModuleUnload(m);
}

void ModuleSet::load(const CompiledKernel& k) {
    Device::get().make_current();
    const DriverApi& api = driver();
    CUmodule mod = nullptr;
    CUresult r = api.cuModuleLoadData(&mod, k.cubin.data());
    if (r != CUDA_SUCCESS)
        throw ModuleRejected(fmt::format("the driver rejected the cubin of {} ({}, {} bytes): {}",
                                         k.spec.name, k.arch, k.cubin.size(),
                                         driver_error_text(r)));
    std::vector<std::pair<std::string, Kernel>> found;
    for (const auto& entry : k.spec.entries) {
        CUfunction fn = nullptr;
        r = api.cuModuleGetFunction(&fn, mod, entry.c_str());
        if (r != CUDA_SUCCESS) {
            api.cuModuleUnload(mod);
            throw ModuleRejected(fmt::format("the cubin of {} has no entry {}: {}", k.spec.name,
                                             entry, driver_error_text(r)));
        }
        found.emplace_back(
            k.spec.name + "/" + entry,
            Kernel(fn, k.spec.name + "/" + entry, ptx_entry_waits_on_grid(k.ptx, entry)));
    }
    modules_.push_back(mod);
    for (size_t i = 0; i < found.size(); ++i) {
        const std::string& entry = k.spec.entries[i];
        auto [it, inserted] = by_entry_.emplace(entry, found[i].first);
        if (!inserted && it->second != found[i].first) it->second.clear();  // now ambiguous
        kernels_.insert_or_assign(found[i].first, std::move(found[i].second));
    }
}

Kernel& ModuleSet::find(std::string_view spec_name, std::string_view entry) {
    std::string full;
    if (spec_name.empty()) {
        auto it = by_entry_.find(std::string(entry));
        if (it == by_entry_.end())
            throw std::invalid_argument(fmt::format("no loaded kernel has entry {}", entry));
        if (it->second.empty())
            throw std::invalid_argument(
                fmt::format("entry {} is defined by several loaded specs; name the spec", entry));
        full = it->second;
    } else {
        full = fmt::format("{}/{}", spec_name, entry);
    }
    auto it = kernels_.find(full);
    if (it == kernels_.end())
        throw std::invalid_argument(fmt::format("kernel {} is not loaded", full));
    return it->second;
}

const Kernel& ModuleSet::kernel(std::string_view spec_name, std::string_view entry) const {
    return const_cast<ModuleSet*>(this)->find(spec_name, entry);
}

void ModuleSet::set_max_dynamic_smem(std::string_view spec_name, std::string_view entry,
                                     int bytes) {
    find(spec_name, entry).set_max_dynamic_smem(bytes);
}

}  // namespace gj::jit
