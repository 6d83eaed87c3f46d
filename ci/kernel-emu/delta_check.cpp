// kernels-hip/delta.hip on the host (common.h here stands in for the device header) against
// a direct transcription of backend/recurrent.rs's delta_net_seq: two consecutive chunks
// from random states, the output and both states compared after each.
// usage: delta_check N_K_HEADS N_V_HEADS HEAD_K HEAD_V N_TOK ROWS(0|1) [GROUPED(0|1)]; prints "MAX <err>".
// GROUPED: value head h reads key head h / (nv / nk) (qwen3next) instead of h mod nk.
#include "delta.hip"
#include <cstdio>
#include <random>
#include <algorithm>
static float sig(float x){return 1.f/(1.f+expf(-x));}
static float sp(float x){return x>20.f?x:log1pf(expf(x));}
static float silu(float x){return x/(1.f+expf(-x));}
struct D { int taps=4, nk, nv, hk, hv, grouped=0; int kd() const {return nk*hk;} int vd() const {return nv*hv;} int ch() const {return 2*kd()+vd();} };
// CPU reference, one sequence (mirrors backend/recurrent.rs delta_net_seq).
void ref(const D& d, const float* w, const float* dtb, const float* a, const float* nw, float eps, const float* qkv, const float* z, const float* beta, const float* alpha, int n, float* conv, float* ssm, float* out) {
    int ch=d.ch(), kd=d.kd(), vd=d.vd(), nv=d.nv, hk=d.hk, hv=d.hv, T=d.taps;
    std::vector<float> xc(n*ch), hist(T-1+n);
    for (int c=0;c<ch;++c){ float* st=conv+c*(T-1); for(int i=0;i<T-1;++i)hist[i]=st[i]; for(int t=0;t<n;++t)hist[T-1+t]=qkv[t*ch+c];
      for(int t=0;t<n;++t){float s=0;for(int j=0;j<T;++j)s+=hist[t+j]*w[c*T+j]; xc[t*ch+c]=silu(s);} for(int i=0;i<T-1;++i)st[i]=hist[n+i]; }
    for(int t=0;t<n;++t) for(int hh=0;hh<2*d.nk;++hh){ float* h=&xc[t*ch+hh*hk]; double s=0; for(int i=0;i<hk;++i)s+=(double)h[i]*h[i]; float inv=1.f/std::max((float)sqrt(s),eps); for(int i=0;i<hk;++i)h[i]*=inv; }
    float scale=1.f/sqrtf(hk);
    for(int h=0;h<nv;++h){ int kh=d.grouped? h/(nv/d.nk): h%d.nk; float* S=ssm+h*hv*hk;
      for(int t=0;t<n;++t){ const float* row=&xc[t*ch]; const float*q=row+kh*hk,*k=row+kd+kh*hk,*v=row+2*kd+h*hv;
        float g=expf(sp(alpha[t*nv+h]+dtb[h])*a[h]), b=sig(beta[t*nv+h]); std::vector<float> o(hv);
        for(int j=0;j<hv;++j){ float* s=S+j*hk; for(int i=0;i<hk;++i)s[i]*=g; float sk=0; for(int i=0;i<hk;++i)sk+=s[i]*k[i]; float dj=(v[j]-sk)*b; for(int i=0;i<hk;++i)s[i]+=dj*k[i]; float oo=0; for(int i=0;i<hk;++i)oo+=s[i]*q[i]; o[j]=oo*scale; }
        double ss=0; for(int j=0;j<hv;++j)ss+=(double)o[j]*o[j]; float r=1.f/sqrtf((float)(ss/hv)+eps);
        for(int j=0;j<hv;++j) out[t*vd+h*hv+j]=o[j]*r*nw[j]*silu(z[t*vd+h*hv+j]); } }
}
int main(int argc, char** argv) {
    D d; d.nk=atoi(argv[1]); d.nv=atoi(argv[2]); d.hk=atoi(argv[3]); d.hv=atoi(argv[4]); int n=atoi(argv[5]); int rows=atoi(argv[6]); d.grouped = argc > 7 ? atoi(argv[7]) : 0;
    std::mt19937 rng(7); std::uniform_real_distribution<float> U(-1,1);
    auto vec=[&](size_t m,float s){std::vector<float> v(m); for(auto&x:v)x=U(rng)*s; return v;};
    int ch=d.ch(), vd=d.vd(), nv=d.nv; float eps=1e-6f;
    auto w=vec(ch*4,0.5), dtb=vec(nv,1), a=vec(nv,1), nw=vec(d.hv,0.2); for(auto&x:a)x=-0.2f-fabsf(x); for(auto&x:nw)x+=1;
    int ns = rows? n:1, per = rows?1:n;
    std::vector<std::vector<float>> conv(ns, vec((size_t)3*ch,1)), ssm(ns, vec((size_t)nv*d.hv*d.hk,0.1));
    auto conv_g=conv, ssm_g=ssm;
    double maxe=0;
    for (int chunk=0; chunk<2; ++chunk) {
      auto qkv=vec((size_t)n*ch,1), z=vec((size_t)n*vd,1), beta=vec((size_t)n*nv,1), alpha=vec((size_t)n*nv,1);
      std::vector<float> out_r((size_t)n*vd), out_g((size_t)n*vd, NAN);
      for(int s=0;s<ns;++s) ref(d,w.data(),dtb.data(),a.data(),nw.data(),eps,&qkv[(size_t)s*per*ch],&z[(size_t)s*per*vd],&beta[s*per*nv],&alpha[s*per*nv],per,conv[s].data(),ssm[s].data(),&out_r[(size_t)s*per*vd]);
      std::vector<u64> table; for(int s=0;s<ns;++s){table.push_back((u64)conv_g[s].data()); table.push_back((u64)ssm_g[s].data());}
      const u64* tb = rows? table.data(): nullptr;
      float* c0 = rows? nullptr: conv_g[0].data(); float* s0 = rows? nullptr: ssm_g[0].data();
      std::vector<float> xq=qkv;
      launch((ch+127)/128, ns, 1, 128, [&]{ delta_conv_k4(xq.data(), w.data(), c0, tb, ch, per); });
      launch(nv, (d.hv+15)/16, ns, 128, [&]{ if (d.hk==128) delta_rule_h128(xq.data(), beta.data(), alpha.data(), dtb.data(), a.data(), out_g.data(), s0, tb, per, d.nk, nv, d.hv, eps, d.grouped);
                                 else delta_rule_h64(xq.data(), beta.data(), alpha.data(), dtb.data(), a.data(), out_g.data(), s0, tb, per, d.nk, nv, d.hv, eps, d.grouped); });
      launch((n*nv+3)/4, 1, 1, 128, [&]{ delta_norm(out_g.data(), z.data(), nw.data(), n*nv, d.hv, eps); });
      auto cmp=[&](const char* what, const std::vector<float>& g, const std::vector<float>& r){ double m=0; size_t bad=0; for(size_t i=0;i<g.size();++i){double e=fabs((double)g[i]-r[i])/(1+fabs(r[i])); if(!(e<=1e-3))bad++; if(e>m||e!=e)m=e;} printf("chunk %d %s: max rel err %.3e, %zu bad of %zu\n",chunk,what,m,bad,g.size()); maxe=std::max(maxe,m); };
      cmp("out", out_g, out_r);
      for(int s=0;s<ns;++s){ cmp("conv", conv_g[s], conv[s]); cmp("ssm", ssm_g[s], ssm[s]); }
    }
    printf("MAX %.3e\n", maxe);
}
