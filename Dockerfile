# Production image: the compiled gateway, production dependencies only, run as the non-root "node" user.
FROM node:20-bookworm-slim AS build
WORKDIR /app
COPY package.json package-lock.json tsconfig.json tsconfig.build.json ./
COPY src ./src
RUN npm ci --ignore-scripts && node node_modules/typescript/bin/tsc -p tsconfig.build.json

FROM node:20-bookworm-slim
ENV NODE_ENV=production
WORKDIR /app
COPY package.json package-lock.json ./
RUN npm ci --omit=dev --ignore-scripts && npm cache clean --force
COPY --from=build /app/dist ./dist
COPY config/gateway.yaml ./config/gateway.yaml
COPY limits.yaml ./limits.yaml
USER node
EXPOSE 8080 9090
# The admin listener stays on loopback inside the container unless ADMIN_HOST says otherwise.
HEALTHCHECK --interval=10s --timeout=3s CMD ["node", "-e", "fetch('http://127.0.0.1:' + (process.env.ADMIN_PORT || 9090) + '/healthz').then((r) => process.exit(r.ok ? 0 : 1), () => process.exit(1))"]
CMD ["node", "dist/main.js"]
